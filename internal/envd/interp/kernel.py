# Spore's Python kernel: one long-lived process per code-interpreter context.
# Standard library only. Requests arrive as JSON lines on stdin; events go
# out as JSON lines on file descriptor 3. Variables live in this process's
# memory, so they survive every snapshot, fork, rollback and hibernation.
import ast
import base64
import json
import os
import signal
import sys
import traceback

_events = os.fdopen(3, "w", buffering=1, encoding="utf-8")
_requests = os.fdopen(4, "r", encoding="utf-8")


def _emit(obj):
    _events.write(json.dumps(obj) + "\n")
    _events.flush()


class _Stream:
    """Replaces sys.stdout/sys.stderr: each complete line becomes an event
    as soon as it is written (print's text and newline arrive as two
    writes); the rest goes out on flush and at the end of the execution."""

    def __init__(self, kind):
        self.kind = kind
        self.encoding = "utf-8"
        self._buf = ""

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            _emit({"type": self.kind, "text": line + "\n"})
        return len(text)

    def flush(self):
        if self._buf:
            _emit({"type": self.kind, "text": self._buf})
            self._buf = ""

    def isatty(self):
        return False

    def fileno(self):
        return 1 if self.kind == "stdout" else 2


_FORMATS = {
    "_repr_html_": "html",
    "_repr_markdown_": "markdown",
    "_repr_svg_": "svg",
    "_repr_png_": "png",
    "_repr_jpeg_": "jpeg",
    "_repr_latex_": "latex",
    "_repr_json_": "json",
    "_repr_javascript_": "javascript",
    "_repr_pdf_": "pdf",
}


def _result(value):
    out = {"type": "result", "is_main_result": True, "text": repr(value)}
    for method, key in _FORMATS.items():
        fn = getattr(value, method, None)
        if callable(fn):
            try:
                data = fn()
            except Exception:
                continue
            if data is None:
                continue
            if isinstance(data, bytes):
                data = base64.b64encode(data).decode()
            out[key] = data
    return out


_globals = {"__name__": "__main__", "__builtins__": __builtins__}
_count = 0


def _run(code):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), _globals)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), _globals)
        if value is not None:
            _globals["_"] = value
            _emit(_result(value))


def _execute(req):
    global _count
    _count += 1
    saved = {}
    for k, v in (req.get("env_vars") or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = str(v)
    try:
        _run(req.get("code", ""))
    except KeyboardInterrupt:
        _emit({"type": "error", "name": "KeyboardInterrupt", "value": "execution interrupted",
               "traceback": "KeyboardInterrupt: execution interrupted"})
    except BaseException as e:  # SystemExit too: the kernel keeps running
        # Keep the user's frames, drop the kernel's own (run as "<string>").
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != "<string>"]
        if isinstance(e, SyntaxError):
            frames = []  # only the parser's frames: the message has the location
        tb = "".join(traceback.format_exception_only(type(e), e))
        if frames:
            tb = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + tb
        _emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": tb})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.stdout.flush()
        sys.stderr.flush()
        _emit({"type": "number_of_executions", "execution_count": _count})
        _emit({"type": "end_of_execution"})


def main():
    cwd = os.environ.pop("SPORE_KERNEL_CWD", "")
    if cwd:
        os.chdir(cwd)
    sys.stdout = _Stream("stdout")
    sys.stderr = _Stream("stderr")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _emit({"type": "ready"})
    while True:
        try:
            line = _requests.readline()
        except KeyboardInterrupt:
            continue  # an interrupt that arrived between executions
        if not line:
            return
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError:
            continue
        _execute(req)


if __name__ == "__main__":
    main()
