"""A real redis-server for end-to-end tests (never a mock).

Started on a free loopback port with a temporary directory and no
persistence; stop() ends it, kill() makes it vanish as in a crash, and
restart() brings it back on the same port (empty: nothing was saved).
"""
import os
import shutil
import socket
import subprocess
import tempfile
import time

from harness import SLOW


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class RedisServer:
    def __init__(self, password=None, debug=False):
        if not shutil.which("redis-server"):
            raise RuntimeError("redis-server is not installed (scripts/setup.sh installs it)")
        self.password = password
        self.debug = debug  # DEBUG (e.g. DEBUG SLEEP to stall it) allowed from loopback
        self.dir = tempfile.mkdtemp(prefix="parley-redis-")
        self.port = _free_port()
        self.proc = None
        self._spawn()

    def _spawn(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir]
        if self.password:
            args += ["--requirepass", self.password]
        if self.debug:
            args += ["--enable-debug-command", "local"]
        deadline = time.time() + 10 * SLOW
        while True:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not _accepts(self.port):
                if self.proc.poll() is not None or time.time() > deadline:
                    break
                time.sleep(0.01)
            else:
                return
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            if time.time() > deadline:  # the port may linger a moment after a kill
                raise RuntimeError("redis-server did not start on port %d" % self.port)
            time.sleep(0.1)

    @property
    def url(self):
        auth = ":%s@" % self.password if self.password else ""
        return "redis://%s127.0.0.1:%d" % (auth, self.port)

    def cli(self, *args):
        """Run a command with redis-cli; returns its output text."""
        env = dict(os.environ)
        if self.password:
            env["REDISCLI_AUTH"] = self.password
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True,
                              text=True, env=env, timeout=10 * SLOW).stdout

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self):
        self.kill()
        self._spawn()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
