"""A package that names another beside it, pinned by content hash: a reduced-precision
package's float32 reference (the oracle runs it) and a quantized package's float original
(its quality is measured against it). Both are refused the same way when the sibling is
missing or has changed since the package was made."""
from __future__ import annotations

from engines.errors import PackageError
from engines.package.hashing import package_content_hash
from engines.package.load import load_package


def pinned_sibling(package, declared, role: str, field: str, remedy: str):
    """The package ``declared`` (``folder``, ``content_hash``) names beside ``package``,
    loaded; ``role`` names it in messages, ``field`` is the package.yaml key declaring it."""
    folder = package.root.parent / declared.folder
    where = str(package.yaml_path)
    if not (folder / "package.yaml").is_file():
        raise PackageError(f"package {package.spec.name!r} declares the {role} package "
                           f"{declared.folder!r}, which is not in {package.root.parent}",
                           field=f"{field}.folder", value=declared.folder, remedy=remedy,
                           where=where)
    actual = package_content_hash(folder)
    if actual != declared.content_hash:
        raise PackageError(f"the {role} package {declared.folder!r} has changed since "
                           f"{package.spec.name!r} was made: its content hash is {actual}",
                           field=f"{field}.content_hash", value=declared.content_hash,
                           remedy=remedy, where=where)
    return load_package(folder)


__all__ = ["pinned_sibling"]
