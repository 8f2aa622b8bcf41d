"""``bpo_envs.swebench.daemon.exec_output``: every byte of a docker exec's output, however the
daemon's answer is split across reads.

A fake daemon on a unix socket answers docker-py's exec start the way dockerd does (the upgrade
headers, then the multiplexed frames), with no Docker needed. The race it replays: on a busy host
the command prints before the client reads the headers, so the first frames arrive in the same
read as the headers and land in http.client's buffered reader, which docker-py's own frame
reader (on the raw socket under it) never looks at (docs/setup.md, "CI time").
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

docker = pytest.importorskip("docker", reason="needs docker-py: pip install 'bpo-gym[swe]'")

from bpo_envs.swebench.daemon import exec_complete, exec_output  # noqa: E402

HEADERS = (b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
           b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n")


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


class FakeDaemon:
    """Answers one exec start per connection with ``HEADERS + body``, sent as ``pieces`` (byte
    counts of successive writes, 5 ms apart; the rest in the last write), then closes. An exec
    create (``POST /containers/ID/exec``) is answered with the exec's id, an exec inspect
    (``GET /exec/ID/json``) with ``exit_code``."""

    def __init__(self, path: Path, body: bytes, pieces: tuple[int, ...] = (), exit_code: int = 0) -> None:
        self.path, self.body, self.pieces, self.exit_code = path, body, pieces, exit_code
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                head, _, body = request.partition(b"\r\n\r\n")
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), b"0"))
                while len(body) < length:
                    body += conn.recv(4096)
                target = head.split(b" ")[1]
                if target.endswith(b"/exec") or target.endswith(b"/json"):
                    reply = json.dumps({"Id": "e1"} if target.endswith(b"/exec") else {"ExitCode": self.exit_code}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                 + f"Content-Length: {len(reply)}\r\n\r\n".encode() + reply)
                    continue
                answer, at = HEADERS + self.body, 0
                for n in self.pieces:
                    conn.sendall(answer[at:at + n])
                    at += n
                    time.sleep(0.005)
                conn.sendall(answer[at:])

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def api(tmp_path):
    client = docker.APIClient(base_url=f"unix://{tmp_path / 'd.sock'}", version="1.41", timeout=5)
    yield client
    client.close()


def test_frames_that_arrive_with_the_headers_are_kept(api, tmp_path):
    """Headers and the whole output in one write (the command ended before the client read the
    headers): docker-py's reader returns nothing of a short output and drops the first 8 KiB
    of a long one; ``exec_output`` returns every byte."""
    short = frame(1, b"./README.md\n./setup.cfg\n")
    long_out = frame(1, b"x" * 20_000) + frame(2, b"warning\n")
    for body, want in ((short, b"./README.md\n./setup.cfg\n"), (long_out, b"x" * 20_000 + b"warning\n")):
        path = tmp_path / "d.sock"
        path.unlink(missing_ok=True)
        daemon = FakeDaemon(path, body)
        try:
            # the broken case: docker-py's own reader, on the same answer
            lost = b"".join(api.exec_start("e1", stream=True))
            assert lost != want, "docker-py now reads through http.client's buffer (exec_output may go)"
            assert b"".join(exec_output(api, "e2")) == want
        finally:
            daemon.close()


def test_frames_split_anywhere_are_put_back_together(api, tmp_path):
    """Headers and frames cut at every kind of boundary (inside the headers, inside a frame's
    header, inside a payload, an empty frame): the payloads in order, stdout and stderr."""
    payloads = [(1, b"a" * 3000), (2, b"err\n"), (1, b""), (1, bytes(range(256)) * 40), (2, b"z")]
    body = b"".join(frame(s, p) for s, p in payloads)
    cuts = (20, len(HEADERS) - 20 + 3, 2000, 1004, 5, 3, 4000)
    daemon = FakeDaemon(tmp_path / "d.sock", body, cuts)
    try:
        chunks = list(exec_output(api, "e"))
    finally:
        daemon.close()
    assert b"".join(chunks) == b"".join(p for _, p in payloads)
    assert b"" not in chunks


def test_a_stream_cut_inside_a_frame_is_an_error(api, tmp_path):
    """A daemon that goes away mid-frame is a ConnectionError, not a shorter output."""
    for body in (frame(1, b"hello")[:-2], frame(1, b"hello") + b"\x01\x00\x00"):
        path = tmp_path / "d.sock"
        path.unlink(missing_ok=True)
        daemon = FakeDaemon(path, body)
        try:
            with pytest.raises(ConnectionError, match="inside a frame"):
                list(exec_output(api, "e"))
        finally:
            daemon.close()


def test_a_command_run_to_its_end_keeps_its_whole_output_and_exit_code(api, tmp_path):
    """``exec_complete`` (the image build's set-up script): the exit code from the exec's
    inspect and every byte of the output, also when it came with the headers, where docker-py's
    ``exec_run`` path (``exec_start`` without a stream) returns it cut (the broken case)."""
    body = frame(1, b"y" * 12_000) + frame(2, b"failed: no such file\n")
    want = b"y" * 12_000 + b"failed: no such file\n"
    daemon = FakeDaemon(tmp_path / "d.sock", body, exit_code=3)
    try:
        assert api.exec_start("e1") != want, "docker-py's non-streamed exec now reads every byte"
        assert exec_complete(api, "c1", ["bash", "-c", "set-up"]) == (3, want)
    finally:
        daemon.close()
