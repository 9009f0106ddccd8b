#!/usr/bin/env python3
"""Talks to a Conclave session over its WebSocket with nothing but the
Python standard library: sends one prompt and prints every event until the
turn's `result`.

usage: python3 examples/ws_client.py SESSION_ID PROMPT [BASE_URL]
       (BASE_URL defaults to ws://127.0.0.1:8080; set CONCLAVE_API_KEY to
       send a key)
"""

import base64
import json
import os
import socket
import struct
import sys
import urllib.parse


def send_frame(sock, opcode, payload):
    # Client frames are masked (RFC 6455, section 5.3).
    mask = os.urandom(4)
    header = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        header += bytes([0x80 | n])
    elif n < 1 << 16:
        header += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        header += bytes([0x80 | 127]) + struct.pack("!Q", n)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(header + mask + masked)


def read_exact(stream, n):
    data = stream.read(n)
    if len(data) < n:
        raise ConnectionError("the server closed the connection")
    return data


def read_frame(stream):
    first, second = read_exact(stream, 2)
    opcode, n = first & 0x0F, second & 0x7F
    if n == 126:
        n = struct.unpack("!H", read_exact(stream, 2))[0]
    elif n == 127:
        n = struct.unpack("!Q", read_exact(stream, 8))[0]
    return opcode, read_exact(stream, n)


def main(session_id, prompt, base="ws://127.0.0.1:8080"):
    url = urllib.parse.urlparse(base)
    host, port = url.hostname, url.port or 80
    path = f"/agent/ws?session_id={urllib.parse.quote(session_id)}&since=0"
    key = os.environ.get("CONCLAVE_API_KEY")
    if key:
        path += f"&token={urllib.parse.quote(key)}"
    sock = socket.create_connection((host, port))
    nonce = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {nonce}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    stream = sock.makefile("rb")
    status = stream.readline().decode()
    headers = []
    while (line := stream.readline()) not in (b"\r\n", b""):
        headers.append(line.decode().strip())
    if " 101 " not in status:
        body = stream.read().decode(errors="replace")
        sys.exit(f"the server refused the WebSocket: {status.strip()} {body}")
    send_frame(sock, 0x1, json.dumps({"type": "message", "prompt": prompt}).encode())
    while True:
        opcode, payload = read_frame(stream)
        if opcode == 0x9:  # ping
            send_frame(sock, 0xA, payload)
        elif opcode == 0x8:  # close
            return
        elif opcode == 0x1:
            event = json.loads(payload)
            print(json.dumps(event), flush=True)
            if event.get("type") == "result":
                send_frame(sock, 0x8, struct.pack("!H", 1000))
                return


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:4])
