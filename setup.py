"""Builds the extension ferry._ferry with the project's CMake (target _ferry) and
packages it with the pure-Python half in python/ferry.

Environment: FERRY_CMAKE_ARGS (extra configure arguments, e.g.
"-DFERRY_WITH_CUDA=OFF"), FERRY_BUILD_JOBS (default: all cores).
"""

import ast
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def version() -> str:
    """__version__ from python/ferry/_version.py, read without importing ferry
    (which needs the extension this builds)."""
    tree = ast.parse((ROOT / "python" / "ferry" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__version__"]:
            return ast.literal_eval(node.value)
    raise RuntimeError("python/ferry/_version.py sets no __version__")


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
    version=version(),
    packages=["ferry", "ferry.compat"],
    package_dir={"": "python"},
    package_data={"ferry": ["py.typed"]},  # PEP 561: the package ships its types
    ext_modules=[Extension("ferry._ferry", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # build/ is the CMake build directory of `make`.
    options={"build": {"build_base": "build-pip"}},
    zip_safe=False,
)
