"""The "new TCP connection per call" design, for comparison with llm_query:
a client that opens a connection to an echo server on 127.0.0.1 for every
request, sends one line, reads the reply line and closes. The server runs in
a process of its own (this script with the argument `server`), as a host
would. Prints the per-request times in nanoseconds as a JSON list.

    python3 tcp_echo.py N
"""
import json
import socket
import subprocess
import sys
import time

REQUEST = b'{"type":"llm_query","id":1,"prompt":"q"}\n'


def read_line(conn):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def server():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            line = read_line(conn)
            if line == b"quit\n":
                return
            conn.sendall(line)


def client(n):
    proc = subprocess.Popen([sys.executable, "-I", "-S", __file__, "server"],
                            stdout=subprocess.PIPE)
    port = int(proc.stdout.readline())
    address = ("127.0.0.1", port)
    samples = []
    clock = time.perf_counter_ns
    try:
        for _ in range(n):
            t0 = clock()
            with socket.create_connection(address) as conn:
                conn.sendall(REQUEST)
                if read_line(conn) != REQUEST:
                    raise RuntimeError("the echo server answered something else")
            samples.append(clock() - t0)
    finally:
        with socket.create_connection(address) as conn:
            conn.sendall(b"quit\n")
        proc.wait()
    print(json.dumps(samples))


if __name__ == "__main__":
    if sys.argv[1:] == ["server"]:
        server()
    else:
        client(int(sys.argv[1]))
