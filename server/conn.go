package server

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
)

type connKey struct{}

// ConnContext is an http.Server.ConnContext hook that lets handlers reach
// their connection. Sample streams use it to size the connection's send
// buffer from their depth: without it the kernel's buffer (up to
// net.ipv4.tcp_wmem's maximum, 4 MiB by default on Linux) holds hundreds
// of batches beyond depth, drawn long before the learner reads them, and
// their priorities are that much staler. rbd serve sets it.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// setSendBuffer sets the send buffer of r's TCP connection to n bytes; it
// reports false when the connection cannot be reached (no ConnContext, not
// TCP).
func setSendBuffer(r *http.Request, n int) bool {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	tcp, ok := c.(*net.TCPConn)
	return ok && tcp.SetWriteBuffer(n) == nil
}
