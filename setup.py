"""pip's way into the CMake build: the extension sharpcheck._sharpcheck is built by CMake with
SHARPCHECK_PYTHON_ONLY (the libraries the module needs, nothing else) in Release, for the
interpreter running pip, and the pure-Python package comes from python/sharpcheck.

Environment: SHARPCHECK_CMAKE_BUILD_DIR keeps CMake's build there (a second install is then
incremental; default: under setuptools' build directory), SHARPCHECK_BUILD_JOBS sets the parallel
jobs (default: every core), SHARPCHECK_CMAKE_ARGS adds arguments to the configure step."""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = pathlib.Path(__file__).parent.resolve()


def project_version() -> str:
    """The version CMakeLists.txt declares, the one place it is written."""
    match = re.search(r"project\(sharpcheck VERSION ([0-9.]+)", (SOURCE / "CMakeLists.txt").read_text())
    if match is None:
        raise RuntimeError("CMakeLists.txt declares no `project(sharpcheck VERSION ...)`")
    return match.group(1)


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        build = pathlib.Path(os.environ.get("SHARPCHECK_CMAKE_BUILD_DIR") or
                             pathlib.Path(self.build_temp).resolve() / "cmake")
        target = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        jobs = os.environ.get("SHARPCHECK_BUILD_JOBS") or str(os.cpu_count() or 2)
        if shutil.which("cmake") is None:
            raise RuntimeError("sharpcheck: cmake is not installed (bash scripts/setup.sh installs it and every "
                               "library the module needs)")
        configure = ["cmake", "-S", str(SOURCE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     "-DSHARPCHECK_PYTHON_ONLY=ON", f"-DPython_EXECUTABLE={sys.executable}"]
        configure += shlex.split(os.environ.get("SHARPCHECK_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "_sharpcheck", "-j", jobs], check=True)
        built = build / "python" / "sharpcheck" / target.name
        if not built.exists():
            raise RuntimeError(f"sharpcheck: CMake built no {built} (the interpreter's extension suffix differs?)")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


setup(
    version=project_version(),
    packages=["sharpcheck"],
    package_dir={"": "python"},
    package_data={"sharpcheck": ["py.typed", "*.pyi"]},
    ext_modules=[CMakeExtension("sharpcheck._sharpcheck")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
