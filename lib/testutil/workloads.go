package testutil

// LoopbackServer is a Python program for a container: a TCP server on 127.0.0.1:8080
// answering each message d with "pong d", one thread per connection (the network tests'
// server, for clusters and forks of connected processes).
const LoopbackServer = `import socket, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 8080)); srv.listen(8)
def serve(c):
    while True:
        d = c.recv(64)
        if not d:
            return
        c.sendall(b"pong " + d)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// LoopbackClient is LoopbackServer's client: one connection (retried until the server
// listens), sending 0, 1, 2, ... every 0.1 s and printing each answer ("pong N") on a line.
const LoopbackClient = `import socket, time, itertools
while True:
    try:
        cl = socket.create_connection(("127.0.0.1", 8080))
        break
    except OSError:
        time.sleep(0.1)
for i in itertools.count():
    cl.sendall(b"%d" % i)
    print(cl.recv(64).decode(), flush=True)
    time.sleep(0.1)
`

// PortClient is a client of a server on 127.0.0.1:8080 that names its connection: it
// keeps one connection (retried until the server listens), sends 0, 1, 2, ... every
// 0.1 s and prints "<its port> <answer>" per round trip; when the connection ends (closed
// or reset) it prints "closed" and idles, so the container runs on.
const PortClient = `import socket, time, itertools
while True:
    try:
        cl = socket.create_connection(("127.0.0.1", 8080))
        break
    except OSError:
        time.sleep(0.1)
port = cl.getsockname()[1]
try:
    for i in itertools.count():
        cl.sendall(b"%d" % i)
        r = cl.recv(64)
        if not r:
            break
        print(port, r.decode(), flush=True)
        time.sleep(0.1)
except OSError:
    pass
print("closed", flush=True)
time.sleep(1000000)
`
