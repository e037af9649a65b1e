#!/usr/bin/env python3
"""`serval chat` driven through a pseudo-terminal (the way a person uses it):
a two-turn conversation with stories260K and a chat template from
../shared/chat-templates, Ctrl-C during an answer stops the answer and not
the program, /save then /clear and /load restore the conversation (the next
greedy answer equals the one before /clear), and over a pipe there are no
prompts or colours."""

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Suite, check, eq  # noqa: E402

suite = Suite("server_chat_cli")
ANSI = re.compile(rb"\x1b\[[0-9;]*m")


def template():
    return os.path.join(Config.shared, "chat-templates", "microsoft-Phi-3.5-mini-instruct.jinja")


class Tty:
    """serval chat on a pseudo-terminal (its controlling terminal: Ctrl-C is a real SIGINT)."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(Config.serval, [Config.serval, "chat", "-m", Config.model(), "--chat-template", template(),
                                     "-t", "1", "--temp", "0", "-n", "24", "-c", "8192", *args])
        self.buf = b""

    def read_until(self, pattern, timeout=30 * Config.time_scale):
        """Reads until `pattern` (bytes) appears after what was consumed; returns the text before it."""
        end = time.monotonic() + timeout
        while pattern not in self.buf:
            left = end - time.monotonic()
            check(left > 0, f"timed out waiting for {pattern!r}; got {self.buf[-300:]!r}")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                check(data, f"serval chat exited while waiting for {pattern!r}; got {self.buf[-300:]!r}")
                self.buf += data
        i = self.buf.index(pattern)
        out, self.buf = self.buf[:i], self.buf[i + len(pattern):]
        return ANSI.sub(b"", out).decode("utf-8", "replace")

    def send(self, text):
        os.write(self.fd, text.encode())

    def say(self, text):
        """Sends a message; returns (answer text, speed line)."""
        self.send(text + "\r")
        out = self.read_until(b"> ")
        lines = [ln for ln in out.replace("\r", "").split("\n")]
        # The echo of what was typed, the answer, the speed line.
        speed = [ln for ln in lines if ln.startswith("[") and "tok/s" in ln]
        check(len(speed) == 1, f"one speed line after the answer: {out!r}")
        body = lines[1:lines.index(speed[0])]
        return "\n".join(body).strip(), speed[0]

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # already reaped
        os.close(self.fd)

    def wait_exit(self, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                r, _, _ = select.select([self.fd], [], [], 0.05)
                if r:
                    self.buf += os.read(self.fd, 65536)
            except OSError:
                pass
        return None


@suite.test
def conversation_ctrl_c_save_and_load(_):
    t = Tty()
    try:
        banner = t.read_until(b"> ")
        check("serval chat" in banner and "/help" in banner, f"banner: {banner!r}")
        a1, s1 = t.say("Hello there")
        check(a1, "first answer")
        check(re.search(r"\d+ tokens", s1), f"speed line: {s1!r}")
        a2, _ = t.say("Tell me about a cat")
        check(a2, "second answer")

        # Ctrl-C during a long answer: it stops, the program stays.
        t.send("/params max_tokens=8000 ignore_eos=true\r")  # seconds of generation at this context
        t.read_until(b"> ")
        t.send("Tell me a long story\r")
        t.read_until(b"\n")  # the echo of the line
        t.read_until(b" ")   # some of the answer is on the screen
        t.send("\x03")
        out = t.read_until(b"> ")
        m = re.search(r"\[stopped: (\d+) tokens", out)
        check(m, f"the answer says it was stopped: {out[-300:]!r}")
        check(int(m.group(1)) < 8000, f"stopped early ({m.group(1)} tokens)")
        t.send("/params max_tokens=24 ignore_eos=false\r")
        t.read_until(b"> ")

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "chat.json")
            t.send(f"/save {path}\r")
            saved_msg = t.read_until(b"> ")
            check("saved 6 messages" in saved_msg, f"/save: {saved_msg!r}")
            saved = json.load(open(path))
            eq([m["role"] for m in saved["messages"]], ["user", "assistant"] * 3, "saved roles")
            eq(saved["messages"][1]["content"].strip(), a1, "first answer saved")
            eq(saved["messages"][3]["content"].strip(), a2, "second answer saved")
            # The next answer, then the same after /clear + /load.
            a4, _ = t.say("What happened next?")
            t.send("/clear\r")
            check("cleared" in t.read_until(b"> "), "/clear")
            t.send(f"/load {path}\r")
            check("loaded 6 messages" in t.read_until(b"> "), "/load")
            a4_again, _ = t.say("What happened next?")
            eq(a4_again, a4, "after /load the conversation continues as before")
            t.send(f"/load {os.path.join(d, 'missing.json')}\r")
            check("error" in t.read_until(b"> "), "/load of a missing file is an error, not an exit")
        t.send("/exit\r")
        eq(t.wait_exit(), 0, "exit status after /exit")
    finally:
        t.close()


@suite.test
def ctrl_c_at_the_prompt_and_ctrl_d_exit(_):
    t = Tty()
    try:
        t.read_until(b"> ")
        t.send("\x04")  # Ctrl-D on an empty line: end of input
        eq(t.wait_exit(), 0, "Ctrl-D exits with 0")
    finally:
        t.close()
    t = Tty()
    try:
        t.read_until(b"> ")
        t.send("\x03")
        code = t.wait_exit()
        check(code is not None, "Ctrl-C at the prompt ends the program")
    finally:
        t.close()


@suite.test
def pipe_mode_has_no_prompts_or_colours(_):
    p = subprocess.run([Config.serval, "chat", "-m", Config.model(), "--chat-template", template(), "-t", "1",
                        "--temp", "0", "-n", "16"],
                       input="Hello there\n\"\"\"\nTwo lines\nof text\n\"\"\"\n/params top_k=banana\n",
                       capture_output=True, text=True, timeout=60 * Config.time_scale)
    eq(p.returncode, 0, f"exit status ({p.stderr[-300:]})")
    check("\x1b[" not in p.stdout and "> " not in p.stdout, f"no colours or prompts: {p.stdout[:200]!r}")
    answers = [ln for ln in p.stdout.split("\n") if ln and not ln.startswith("error")]
    check(len(answers) >= 2, f"two answers: {p.stdout!r}")
    check("error: top_k" in p.stdout, f"a bad /params value is an error line: {p.stdout!r}")
    eq(len(re.findall(r"tok/s", p.stderr)), 2, f"a speed line per answer on stderr: {p.stderr!r}")
    # Bad flags: one line and status 2.
    b = subprocess.run([Config.serval, "chat", "-m", Config.model(), "--temp", "-1"], capture_output=True, text=True)
    eq(b.returncode, 2, "bad flag status")
    b = subprocess.run([Config.serval, "chat", "-m", Config.model()], input="", capture_output=True, text=True)
    check(b.returncode == 2 and "chat template" in b.stderr, f"no template: {b.stderr!r}")


@suite.test
def history_is_kept_within_the_context(_):
    # A 160-token context holds about two turns of this template: later turns drop the oldest, with a notice.
    msgs = "".join(f"Tell me about animal number {k}\n" for k in range(6)) + "/save {}\n"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "h.json")
        p = subprocess.run([Config.serval, "chat", "-m", Config.model(), "--chat-template", template(), "-t", "1",
                            "--temp", "0", "-n", "20", "-c", "160"], input=msgs.format(path),
                           capture_output=True, text=True, timeout=60 * Config.time_scale)
        eq(p.returncode, 0, f"exit status ({p.stderr[-300:]})")
        check("dropped the oldest turn" in p.stderr, f"a notice when turns are dropped: {p.stderr[-400:]!r}")
        eq(len(re.findall(r"tok/s", p.stderr)), 6, "every message answered")
        kept = json.load(open(path))["messages"]
        check(2 <= len(kept) < 12, f"only the latest turns are kept ({len(kept)} messages)")
        eq(kept[-2]["content"], "Tell me about animal number 5", "the newest turn is kept")
    # A single message longer than the context is refused, the program goes on.
    p = subprocess.run([Config.serval, "chat", "-m", Config.model(), "--chat-template", template(), "-t", "1",
                        "-n", "8", "-c", "64"], input="word " * 200 + "\nHi\n", capture_output=True, text=True,
                       timeout=60 * Config.time_scale)
    eq(p.returncode, 0, "exit status")
    check("longer than the context" in p.stderr or "the context only" in p.stderr, f"refused: {p.stderr!r}")
    eq(len(re.findall(r"tok/s", p.stderr)), 1, "the next message is answered")


if __name__ == "__main__":
    suite.main()
