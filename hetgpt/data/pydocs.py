"""
The pydocs corpus, offline: Python's own documentation as documents (data/prepare.py --dataset
pydocs). The pydoc topics of pydoc_data, and one document per standard library module with the
docstrings of its public classes, methods and functions, collected by a child interpreter.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def documents():
    """The pydoc topics and the docstrings of the standard library; raises RuntimeError with a
    line that says what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "docs.json")
        # A separate interpreter: module imports cannot touch this process, a hang ends at the
        # timeout, no display means no window, and a fixed hash seed fixes the order of set reprs
        # in signatures.
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        env["PYTHONHASHSEED"] = "0"
        cmd = [sys.executable, "-s", "-W", "ignore", os.path.abspath(__file__), out]
        try:
            r = subprocess.run(cmd, env=env, cwd=tmp, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               timeout=600)
        except subprocess.TimeoutExpired:
            raise RuntimeError("collecting the standard library docstrings took over 10 minutes; "
                               "use --input instead") from None
        if r.returncode != 0 or not os.path.exists(out):
            last = (r.stderr.strip().splitlines() or ['?'])[-1]
            raise RuntimeError(f"collecting the standard library docstrings failed: {last}")
        with open(out, encoding="utf-8") as f:
            modules = json.load(f)
    from pydoc_data.topics import topics
    return [tidy(topics[k]) for k in sorted(topics)] + [tidy(m) for m in modules]


def tidy(doc):
    # A document as prose: a table's rule lines (+----+, ====) dropped, the spaces that align its
    # columns one, blank lines empty, trailing spaces gone; a line's indentation (code) kept.
    # GPT-2's BPE writes a run of spaces one token per space, and a small model that has met
    # runs of 40 repeats them to the end of its sample (make demo's; bench/RESULTS.md).
    lines = []
    for line in doc.splitlines():
        if len(line.strip()) > 3 and not re.sub(r"[-=+|*_ ]", "", line):
            continue
        text = re.sub(r" {2,}", " ", line.strip())
        indent = line[:len(line) - len(line.lstrip(" "))] if text else ""
        lines.append(indent + text)
    return "\n".join(lines)


def dump_stdlib_docs(out):
    """(Runs in the child of documents().) One document per stdlib module: its docstring and
    those of its public classes, their methods and its functions, with signatures."""
    import importlib, inspect, pkgutil, re, signal, sysconfig
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (HERE, ROOT)]
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    # GUIs, easter eggs, the test suite, generated codecs, a lib2to3 that writes grammar caches
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test",
            "pydoc_data", "encodings", "lib2to3", "ensurepip"}

    def on_alarm(*_):
        raise TimeoutError
    alarm = getattr(signal, "alarm", lambda seconds: None)  # no SIGALRM on Windows
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, on_alarm)

    def load(name):
        if any(p in ("__main__", "test", "tests") for p in name.split(".")):
            return None  # running __main__ modules starts programs (asyncio's starts a REPL)
        alarm(20)  # an import that hangs is given up
        try:
            m = importlib.import_module(name)
        except BaseException:  # missing C extension, other platform, SystemExit, ...
            return None
        finally:
            alarm(0)
        path = getattr(m, "__file__", None)  # None: built into the interpreter
        return m if path is None or os.path.realpath(path).startswith(stdlib) else None

    class Elided:
        def __repr__(self):
            return "..."
    local = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.expanduser("~"),
             os.getcwd()} - {"", "/"}

    def entry(title, obj):
        doc = getattr(obj, "__doc__", None)
        if not isinstance(doc, str) or not doc.strip():
            return None
        try:
            sig = inspect.signature(obj) if callable(obj) else ""
        except Exception:  # no signature, or a C signature that does not evaluate here
            sig = ""
        if sig:  # defaults that show this machine (os.environ, sys.executable, ...) become "..."
            sig = sig.replace(parameters=[
                q.replace(default=Elided()) if q.default is os.environ
                or any(s in repr(q.default) for s in local) else q
                for q in sig.parameters.values()])
        return re.sub(r" at 0x[0-9a-fA-F]+", "", f"{title}{sig}\n{inspect.cleandoc(doc)}")

    def document(name, m):
        parts = [f"Module {name}"]
        if isinstance(m.__doc__, str):
            parts.append(inspect.cleandoc(m.__doc__))
        for k, v in sorted(vars(m).items()):
            if k.startswith("_") or getattr(v, "__module__", None) not in (name, "_" + name):
                continue  # private, or imported from elsewhere (but heapq's C part is _heapq)
            if inspect.isclass(v) or inspect.isroutine(v):
                parts.append(entry(f"{name}.{k}", v))
            if inspect.isclass(v):
                for mk, mv in sorted(vars(v).items()):
                    mv = mv.__func__ if isinstance(mv, (classmethod, staticmethod)) else mv
                    public = not mk.startswith("_") or inspect.isfunction(mv)  # own __init__ etc.
                    if public and (inspect.isroutine(mv) or isinstance(mv, property)):
                        parts.append(entry(f"{name}.{k}.{mk}", mv))
        parts = [p for p in parts if p]
        if len(parts) > 1:
            docs.append("\n\n".join(parts))
        # then the submodules of a package, depth first (iter_modules lists them sorted)
        subs = sorted(pkgutil.iter_modules(getattr(m, "__path__", [])), key=lambda i: i.name)
        for info in subs:
            if (sub := load(f"{name}.{info.name}")) is not None:
                document(f"{name}.{info.name}", sub)

    docs = []
    for top in sorted(sys.stdlib_module_names):
        if not top.startswith("_") and top not in skip and (m := load(top)) is not None:
            document(top, m)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(docs, f)


if __name__ == "__main__":  # the child of documents()
    dump_stdlib_docs(sys.argv[1])
