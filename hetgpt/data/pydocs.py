"""
The pydocs corpus, offline: Python's own documentation as documents
(data/prepare.py --dataset pydocs). The pydoc topics of pydoc_data, and one
document per standard library module with the docstrings of its public
classes, methods and functions, collected by a child interpreter.
"""
import importlib
import inspect
import json
import os
import pkgutil
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def documents():
    """The pydoc topics and the docstrings of the standard library; raises
    RuntimeError with a line that says what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "docs.json")
        # A separate interpreter: module imports cannot touch this process,
        # a hang ends at the timeout, no display means no window, and a
        # fixed hash seed fixes the order of set reprs in signatures.
        env = {k: v for k, v in os.environ.items()
               if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        env["PYTHONHASHSEED"] = "0"
        cmd = [sys.executable, "-s", "-W", "ignore",
               os.path.abspath(__file__), out]
        try:
            r = subprocess.run(cmd, env=env, cwd=tmp,
                               stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               timeout=600)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                "collecting the standard library docstrings took over "
                "10 minutes; use --input instead") from None
        if r.returncode != 0 or not os.path.exists(out):
            last = (r.stderr.strip().splitlines() or ['?'])[-1]
            raise RuntimeError(
                f"collecting the standard library docstrings failed: "
                f"{last}")
        with open(out, encoding="utf-8") as f:
            modules = json.load(f)
    from pydoc_data.topics import topics
    return ([tidy(topics[k]) for k in sorted(topics)]
            + [tidy(m) for m in modules])


def tidy(doc):
    """A document as prose: a table's rule lines (+----+, ====) dropped,
    the spaces that align its columns one, blank lines empty, trailing
    spaces gone; a line's indentation (code) kept.

    GPT-2's BPE writes a run of spaces one token per space, and a small
    model that has met runs of 40 repeats them to the end of its sample
    (make demo's; bench/RESULTS.md).
    """
    lines = []
    for line in doc.splitlines():
        if len(line.strip()) > 3 and not re.sub(r"[-=+|*_ ]", "", line):
            continue
        text = re.sub(r" {2,}", " ", line.strip())
        indent = ""
        if text:
            indent = line[:len(line) - len(line.lstrip(" "))]
        lines.append(indent + text)
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# The child of documents(): run as a script, it writes the standard
# library's documents to the file its argument names
def dump_stdlib_docs(out):
    """(Runs in the child of documents().) One document per stdlib
    module: its docstring and those of its public classes, their methods
    and its functions, with signatures."""
    sys.path[:] = [p for p in sys.path
                   if os.path.abspath(p or ".") not in (HERE, ROOT)]
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    # GUIs, easter eggs, the test suite, generated codecs, a lib2to3 that
    # writes grammar caches
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle",
            "turtledemo", "test", "pydoc_data", "encodings", "lib2to3",
            "ensurepip"}
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _on_alarm)
    local = {sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.expanduser("~"), os.getcwd()} - {"", "/"}
    docs = []
    for top in sorted(sys.stdlib_module_names):
        if top.startswith("_") or top in skip:
            continue
        m = _load(top, stdlib)
        if m is not None:
            _document(top, m, docs, stdlib, local)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(docs, f)


def _on_alarm(*_):
    """SIGALRM's handler: the import under way is given up."""
    raise TimeoutError


def _alarm(seconds):
    """signal.alarm(seconds) where there is one (no SIGALRM on
    Windows)."""
    if hasattr(signal, "alarm"):
        signal.alarm(seconds)


def _load(name, stdlib):
    """The module name, imported; None for a __main__ or test module, one
    that fails or hangs on import, and one from outside the folder stdlib.
    """
    if any(p in ("__main__", "test", "tests") for p in name.split(".")):
        # running __main__ modules starts programs (asyncio's starts a
        # REPL)
        return None
    _alarm(20)  # an import that hangs is given up
    try:
        m = importlib.import_module(name)
    except BaseException:
        # missing C extension, other platform, SystemExit, ...
        return None
    finally:
        _alarm(0)
    path = getattr(m, "__file__", None)  # None: built into the interpreter
    if path is None or os.path.realpath(path).startswith(stdlib):
        return m
    return None


class Elided:
    """A default that shows this machine, written as "..."."""

    def __repr__(self):
        """The default as pydoc shows it: "..."."""
        return "..."


def _elided(q, local):
    """Parameter q, with its default as "..." where that shows this
    machine (os.environ, sys.executable, ...: a path of local)."""
    if q.default is os.environ or any(s in repr(q.default) for s in local):
        return q.replace(default=Elided())
    return q


def _entry(title, obj, local):
    """obj's entry in its module's document: title, its signature and its
    docstring; None when it has no docstring."""
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    try:
        sig = ""
        if callable(obj):
            sig = inspect.signature(obj)
    except Exception:
        # no signature, or a C signature that does not evaluate here
        sig = ""
    if sig:  # defaults that show this machine become "..."
        sig = sig.replace(parameters=[
            _elided(q, local) for q in sig.parameters.values()])
    text = f"{title}{sig}\n{inspect.cleandoc(doc)}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _document(name, m, docs, stdlib, local):
    """Appends module m's document to docs (when it has an entry), then
    its submodules', depth first."""
    parts = [f"Module {name}"]
    if isinstance(m.__doc__, str):
        parts.append(inspect.cleandoc(m.__doc__))
    for k, v in sorted(vars(m).items()):
        if k.startswith("_"):
            continue  # private
        if getattr(v, "__module__", None) not in (name, "_" + name):
            # imported from elsewhere (but heapq's C part is _heapq)
            continue
        if inspect.isclass(v) or inspect.isroutine(v):
            parts.append(_entry(f"{name}.{k}", v, local))
        if not inspect.isclass(v):
            continue
        for mk, mv in sorted(vars(v).items()):
            if isinstance(mv, (classmethod, staticmethod)):
                mv = mv.__func__
            # (own __init__ etc.)
            if mk.startswith("_") and not inspect.isfunction(mv):
                continue
            if inspect.isroutine(mv) or isinstance(mv, property):
                parts.append(_entry(f"{name}.{k}.{mk}", mv, local))
    parts = [p for p in parts if p]
    if len(parts) > 1:
        docs.append("\n\n".join(parts))
    # then the submodules of a package, depth first (iter_modules lists
    # them sorted)
    found = pkgutil.iter_modules(getattr(m, "__path__", []))
    for info in sorted(found, key=lambda i: i.name):
        sub = _load(f"{name}.{info.name}", stdlib)
        if sub is not None:
            _document(f"{name}.{info.name}", sub, docs, stdlib, local)


if __name__ == "__main__":  # the child of documents()
    dump_stdlib_docs(sys.argv[1])
