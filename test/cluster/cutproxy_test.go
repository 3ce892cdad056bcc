package cluster

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// A server that sends 1 MiB to each connection, through the proxy armed at
// 100 KiB: the client gets exactly the first 100 KiB and nothing more until
// Release, which ends the connection; a connection made after Release(false)
// gets all of it, one after Release(true) nothing.
func TestCutProxyHoldsAtTheThreshold(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write(payload)
			}()
		}
	}()
	p, err := NewCutProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const limit = 100 << 10

	p.Arm(limit)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make([]byte, limit)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload[:limit]) {
		t.Fatal("the first bytes differ from what the server sent")
	}
	<-p.Held()
	p.Release(false)
	if n, _ := io.Copy(io.Discard, c); n != 0 {
		t.Errorf("after the threshold the client got %d more bytes, want 0", n)
	}

	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if all, err := io.ReadAll(c2); err != nil || !bytes.Equal(all, payload) {
		t.Errorf("after Release(false) a new connection got %d bytes (%v), want all %d", len(all), err, len(payload))
	}

	p.Release(true)
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if n, _ := io.Copy(io.Discard, c3); n != 0 {
		t.Errorf("after Release(true) a new connection got %d bytes, want 0", n)
	}
}
