package client

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
)

func TestFrames(t *testing.T) {
	var buf bytes.Buffer
	for _, f := range []struct {
		typ byte
		p   []byte
	}{{FrameStdout, []byte("hello")}, {FrameCloseIn, nil}, {FrameExit, []byte{0, 0, 0, 3}}} {
		if err := WriteFrame(&buf, f.typ, f.p); err != nil {
			t.Fatal(err)
		}
		typ, p, err := ReadFrame(&buf)
		if err != nil || typ != f.typ || !bytes.Equal(p, f.p) {
			t.Errorf("frame %d %q: read back %d %q %v", f.typ, f.p, typ, p, err)
		}
	}
	if err := WriteFrame(&buf, FrameStdin, make([]byte, MaxFrame+1)); err == nil {
		t.Error("an oversized frame was written")
	}
	// A corrupt length is refused before anything is allocated.
	if _, _, err := ReadFrame(bytes.NewReader([]byte{1, 0xff, 0xff, 0xff, 0xff})); err == nil {
		t.Error("a 4 GiB frame header was accepted")
	}
}

func TestErrors(t *testing.T) {
	_, err := New(filepath.Join(t.TempDir(), "none.sock")).Ping(context.Background())
	if !IsCode(err, CodeDaemonUnreached) {
		t.Errorf("no daemon: %v", err)
	}

	// A server that answers errors: JSON ones keep their code, others become "failed".
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/ping", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"code": "not_found", "message": "gone"}`))
	})
	mux.HandleFunc("/v1/status", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "proxy trouble", http.StatusBadGateway)
	})
	go http.Serve(l, mux)
	cl := New(sock)
	_, err = cl.Ping(context.Background())
	if e, ok := err.(*Error); !ok || e.Code != CodeNotFound || e.Status != 404 || e.Message != "gone" {
		t.Errorf("JSON error: %#v", err)
	}
	_, err = cl.Status(context.Background())
	if e, ok := err.(*Error); !ok || e.Code != CodeFailed || e.Status != 502 {
		t.Errorf("plain error: %#v", err)
	}
}
