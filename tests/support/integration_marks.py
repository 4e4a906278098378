"""Which tests are integration tests, decided from their code rather than a list.

``make test-fast`` runs the unit tests only (``-m "not integration and not
slow"``); a hand-kept list of integration tests would rot as tests are added,
so tests/conftest.py's collection hook marks ``integration`` every test that
starts a process: a broker (``harness.BrokerProcess``), Spark
(``SparkSession``), etcd (``LocalEtcd``), a browser or any other subprocess.

A test starts a process when the code it runs refers to one of
``PROCESS_NAMES``, looking through the test function, every fixture in its
closure (the definitions in effect for it) and every function or class its
module imports (a module that imports ``subprocess`` itself counts whole);
from there the search follows the functions, classes and modules the code
refers to, so ``BrokerProcess``, ``start_members`` or ``Browser`` are found
through their use of ``subprocess``. It does not follow into library code
(npstream itself, the standard library, installed packages): a unit test may
call into npstream freely.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import CodeType, FunctionType, ModuleType

import pytest

MARK = "integration"

# Names whose use starts a process (module, class or attribute names).
PROCESS_NAMES = frozenset({
    "subprocess", "multiprocessing", "fork", "posix_spawn",
    "SparkSession", "SparkContext", "LocalEtcd",
})


def _library_roots() -> tuple[Path, ...]:
    """Folders of code that is not followed: npstream's packages, stdlib, site-packages."""
    paths = sysconfig.get_paths()
    roots = {Path(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    for name in ("npstream", "npstream.broker", "npstream.proto"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.update(Path(location) for location in spec.submodule_search_locations)
    return tuple(root.resolve() for root in roots)


LIBRARY_ROOTS = _library_roots()


@functools.cache
def _followed(filename: str) -> bool:
    """Code of the tests and their helpers (not of a library) is searched."""
    path = Path(filename).resolve()
    return not any(path.is_relative_to(root) for root in LIBRARY_ROOTS)


def _code_names(code: CodeType) -> set[str]:
    """Global and attribute names a code object and the functions nested in it refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _code_names(const)
    return names


def _functions(obj: object) -> Iterator[FunctionType]:
    """The functions behind a test, fixture or class that is not library code."""
    obj = getattr(obj, "__func__", obj)  # bound methods, staticmethod, classmethod
    if isinstance(obj, property):
        for accessor in (obj.fget, obj.fset, obj.fdel):
            yield from _functions(accessor)
    elif isinstance(obj, FunctionType):
        inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)
        if inner is not None:
            yield from _functions(inner)
        obj = inspect.unwrap(obj)
        if _followed(obj.__code__.co_filename):
            yield obj
    elif isinstance(obj, type):
        for member in vars(obj).values():
            yield from _functions(member)


def _referred(names: set[str], namespace: dict[str, object]) -> Iterator[object]:
    """What ``names`` (a code object's) are in ``namespace``; through a module that is
    not library code (``harness.BrokerProcess``), the module's members named too."""
    for name in names:
        target = namespace.get(name)
        if isinstance(target, ModuleType):
            filename = getattr(target, "__file__", None)  # none for built-in modules
            if filename is not None and _followed(filename):
                yield from (vars(target)[attr] for attr in names & vars(target).keys())
        elif target is not None:
            yield target


class ProcessFinder:
    """Answers "does running this code start a process?", remembering what it found."""

    def __init__(self) -> None:
        self._known: dict[int, bool] = {}

    def any(self, objects: Iterable[object]) -> bool:
        return any(self._function(f) for obj in objects for f in _functions(obj))

    def _function(self, func: FunctionType) -> bool:
        key = id(func.__code__)
        if key not in self._known:
            self._known[key] = False  # a cycle (recursion, mutual calls) is cut where it closes
            names = _code_names(func.__code__)
            found = bool(names & PROCESS_NAMES) or self.any(
                _referred(names, func.__globals__))
            self._known[key] = found
        return self._known[key]

    def module_imports(self, module: ModuleType) -> bool:
        """The module imports a process-starting name, or a function or class that
        starts one (whole helper modules count by what the tests use of them)."""
        if vars(module).keys() & PROCESS_NAMES:
            return True
        return self.any(value for value in vars(module).values()
                        if getattr(value, "__module__", None) != module.__name__)

    def starts_process(self, item: pytest.Item) -> bool:
        module = getattr(item, "module", None)
        if module is not None and self.module_imports(module):
            return True
        if self.any([getattr(item, "obj", None)]):
            return True
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        return self.any(definition.func for name in getattr(item, "fixturenames", ())
                        for definition in _in_effect(defs.get(name, ())))


def _in_effect(definitions: Sequence[pytest.FixtureDef[object]]
                ) -> Iterator[pytest.FixtureDef[object]]:
    """The definitions of one fixture name a test runs: the closest, and the one it
    overrides only when it asks for it (a fixture that takes its own name)."""
    for definition in reversed(definitions):
        yield definition
        if definition.argname not in definition.argnames:
            return


def mark_integration(items: list[pytest.Item]) -> None:
    """Add the ``integration`` mark to every item that starts a process."""
    finder = ProcessFinder()
    for item in items:
        if finder.starts_process(item):
            item.add_marker(MARK)
