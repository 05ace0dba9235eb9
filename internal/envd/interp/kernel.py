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

# Not for children: one that outlived the kernel would keep these pipes
# open (the daemon would wait on it), and could read requests or forge events.
os.set_inheritable(3, False)
os.set_inheritable(4, False)
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
_running = False  # the user's code runs: an interrupt is for it
_sync = b""  # sync marker prefix (see raw.go); set in main
_raw = {}  # stream name -> the kernel's own copy of its fd 1 or 2


def _on_sigint(signum, frame):
    # The daemon interrupts the user's code. An interrupt that arrives after
    # that code finished (the client left as the execution ended) must not
    # cut the end of the execution or kill the kernel between executions.
    if _running:
        raise KeyboardInterrupt


def _mark():
    """Writes the sync marker to the raw stdout and stderr pipes, after
    everything child processes wrote there during this execution, and
    returns the streams it reached (one write under PIPE_BUF: whole or not
    at all). Through the kernel's own copies of fds 1 and 2, so user code
    that closed or redirected those does not make the daemon wait for a
    marker that never comes."""
    marker = _sync + b"%016x" % _count
    done = []
    for name, fd in _raw.items():
        try:
            if os.write(fd, marker) == len(marker):
                done.append(name)
        except OSError:
            pass
    return done


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
    global _count, _running
    _count += 1
    saved = {}
    for k, v in (req.get("env_vars") or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = str(v)
    try:
        _running = True
        try:
            _run(req.get("code", ""))
        finally:
            _running = False
    except KeyboardInterrupt:
        _running = False
        _emit({"type": "error", "name": "KeyboardInterrupt", "value": "execution interrupted",
               "traceback": "KeyboardInterrupt: execution interrupted"})
    except BaseException as e:  # SystemExit too: the kernel keeps running
        _running = False
        # Keep the user's frames, drop the kernel's own (run as "<string>").
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != "<string>"]
        if isinstance(e, SyntaxError):
            frames = []  # only the parser's frames: the message has the location
        tb = "".join(traceback.format_exception_only(type(e), e))
        if frames:
            tb = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + tb
        _emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": tb})
    finally:
        _running = False
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass  # a user's replacement stream: the end must still come
        synced = _mark()
        _emit({"type": "number_of_executions", "execution_count": _count})
        _emit({"type": "end_of_execution", "execution_count": _count, "synced": synced})


def main():
    global _sync
    cwd = os.environ.pop("SPORE_KERNEL_CWD", "")
    if cwd:
        os.chdir(cwd)
    _sync = b"\x00spore-sync:" + os.environ.pop("SPORE_KERNEL_SYNC", "").encode() + b":"
    _raw["stdout"] = os.dup(1)  # not inheritable
    _raw["stderr"] = os.dup(2)
    sys.stdout = _Stream("stdout")
    sys.stderr = _Stream("stderr")
    signal.signal(signal.SIGINT, _on_sigint)
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
