"""Build of vllm_rl: the Python package, the top-level folders mapped into it, and csrc/.

``patches/`` and ``kernels/`` become ``vllm_rl.patches`` and ``vllm_rl.kernels``.  When
``csrc/`` holds C++ sources, CMake (``CMakeLists.txt``) builds them with pybind11 into
the extension ``vllm_rl._C``.  The engine (vLLM and torch) is installed by
``scripts/install.sh``, which picks the CPU or the CUDA build.
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MAPPED = {"vllm_rl.patches": "patches", "vllm_rl.kernels": "kernels"}


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import pybind11

        out = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build = Path(self.build_temp) / ext.name
        build.mkdir(parents=True, exist_ok=True)
        cfg = "Debug" if self.debug else "Release"
        subprocess.check_call([
            "cmake", str(ROOT), f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        ], cwd=build)
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", ".", "--config", cfg, "-j", jobs], cwd=build)


def ext_modules():
    has_sources = any(p.suffix in (".cc", ".cpp") for p in (ROOT / "csrc").glob("*"))
    return [CMakeExtension("vllm_rl._C")] if has_sources else []


packages = find_packages(include=["vllm_rl", "vllm_rl.*"])
package_dir = {"": "."}
for name, folder in MAPPED.items():
    if (ROOT / folder / "__init__.py").exists():
        packages.append(name)
        package_dir[name] = folder
        packages += [f"{name}.{sub}" for sub in find_packages(where=str(ROOT / folder))]

BENCH = ["tqdm", "matplotlib"]

setup(
    name="vllm-rl",
    version="0.1.0",
    description="A vLLM engine for RL rollouts: DARTS, DUET, DAS and ARRoL per request",
    python_requires=">=3.10",
    packages=packages,
    package_dir=package_dir,
    package_data={"vllm_rl.task": ["model/*", "reasoning_model/*"], "vllm_rl.cost": ["data/*.json"],
                  "vllm_rl.integrations.verl": ["*.yaml"]},
    include_package_data=True,
    ext_modules=ext_modules(),
    cmdclass={"build_ext": CMakeBuild},
    install_requires=["numpy", "google-re2"],
    # bench: `vllm-rl bench` and the demo's report (progress bars, PNGs); test: the suite,
    # with pybind11 and cmake for the fast rebuild of the suffix tree in place
    # (`python setup.py build_ext --inplace`), which the isolated build does not leave
    extras_require={"bench": BENCH,
                    "test": ["pytest>=8", "hypothesis>=6", "ruff==0.17.6", "pybind11>=2.12",
                             "cmake>=3.18", *BENCH]},
    entry_points={
        "vllm.general_plugins": ["vllm_rl = vllm_rl.plugin:register"],
        "vllm.endpoint_plugins": ["vllm_rl = vllm_rl.endpoint:RLEndpoints"],
        "console_scripts": ["vllm-rl = vllm_rl.cli:main"],
        "verl.plugins": ["vllm_rl = vllm_rl.integrations.verl.plugin"],
    },
    zip_safe=False,
)
