"""Compatibility shims: the private names of other libraries that slurmkit cannot avoid.

One module per library (``compat/s3fs.py``, ...), the only place in slurmkit that touches that
library's private names. Each module lists the names it uses, why no public API does the same,
and the library versions it was tested with; ``pyproject.toml`` bounds the library to those.
A module here imports its library only inside its functions (or is imported only where the
library is already loaded), so importing a shim costs nothing.
"""
