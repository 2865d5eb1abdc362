"""Builds the extension ferry._ferry with the project's CMake (target _ferry) and
packages it with the pure-Python half in python/ferry.

Environment: FERRY_CMAKE_ARGS (extra configure arguments, e.g.
"-DFERRY_WITH_CUDA=OFF"), FERRY_BUILD_JOBS (default: all cores).
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = Path(self.build_temp).resolve() / "cmake"
        py_dir = build_dir / "python"
        args = ["-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                "-DBUILD_TESTING=OFF", "-DFERRY_REQUIRE_PYTHON=ON",
                f"-DPython3_EXECUTABLE={sys.executable}",
                f"-DFERRY_PY_DIR={py_dir}"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        try:  # a pip-installed pybind11; Debian's is found by CMake itself
            import pybind11

            args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        args += shlex.split(os.environ.get("FERRY_CMAKE_ARGS", ""))
        jobs = os.environ.get("FERRY_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", *args])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_ferry",
                               "-j", jobs])
        built = next((py_dir / "ferry").glob("_ferry*.so"), None)
        if built is None:
            raise RuntimeError(f"CMake built no _ferry*.so in {py_dir / 'ferry'}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


setup(
    packages=["ferry", "ferry.compat"],
    package_dir={"": "python"},
    ext_modules=[Extension("ferry._ferry", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # build/ is the CMake build directory of `make`.
    options={"build": {"build_base": "build-pip"}},
    zip_safe=False,
)
