package testutil

import "fmt"

// TCPServer is a Python program for a container: a TCP server on host:port answering each
// message d with reply+d, one thread per connection (the network tests' server, for
// clusters and forks of connected processes).
func TCPServer(host string, port int, reply string) string {
	return fmt.Sprintf(`import socket, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((%q, %d)); srv.listen(16)
def serve(c):
    while True:
        d = c.recv(64)
        if not d:
            return
        c.sendall(b%q + d)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`, host, port, reply)
}

// LoopbackServer is TCPServer on 127.0.0.1:8080 answering "pong d".
var LoopbackServer = TCPServer("127.0.0.1", 8080, "pong ")

// connectLoopback is how both clients start: one connection to 127.0.0.1:8080, retried
// until the server listens.
const connectLoopback = `import socket, time, itertools
while True:
    try:
        cl = socket.create_connection(("127.0.0.1", 8080))
        break
    except OSError:
        time.sleep(0.1)
`

// LoopbackClient is LoopbackServer's client: one connection (retried until the server
// listens), sending 0, 1, 2, ... every 0.1 s and printing each answer ("pong N") on a line.
const LoopbackClient = connectLoopback + `for i in itertools.count():
    cl.sendall(b"%d" % i)
    print(cl.recv(64).decode(), flush=True)
    time.sleep(0.1)
`

// PortClient is a client of a server on 127.0.0.1:8080 that names its connection: it
// keeps one connection (retried until the server listens), sends 0, 1, 2, ... every
// 0.1 s and prints "<its port> <answer>" per round trip; when the connection ends (closed
// or reset) it prints "closed" and idles, so the container runs on.
const PortClient = connectLoopback + `port = cl.getsockname()[1]
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
