"""Only for what pyproject.toml cannot say: ship ``walstream-spark.pth`` at the root of the wheel,
so that it lands in site-packages and runs ``walstream_spark_python`` at interpreter start (see
that module). An editable install (``pip install -e``) does not get it; ``import
walstream_spark`` runs the same module."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "walstream-spark.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        (Path(self.build_lib) / PTH).write_text((Path("src") / PTH).read_text())

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildWithPth})
