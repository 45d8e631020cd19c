package client_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/rbdb/rbd/client"
)

// fakeDNS answers SRV questions for one name with targets on 127.0.0.1 (an
// A record each), as a Kubernetes headless Service's DNS would, over UDP
// on loopback; anything else gets NXDOMAIN.
func fakeDNS(t *testing.T, name string, ports []int) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	fq := dnsmessage.MustNewName(name + ".")
	go func() {
		buf := make([]byte, 1500)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RCode: dnsmessage.RCodeSuccess})
			b.EnableCompression()
			known := q.Name.String() == fq.String() && q.Type == dnsmessage.TypeSRV
			target := func(i int) dnsmessage.Name { return dnsmessage.MustNewName("rbd-" + strconv.Itoa(i) + ".rbd.test.") }
			isTarget := -1
			for i := range ports {
				if q.Name.String() == target(i).String() && q.Type == dnsmessage.TypeA {
					isTarget = i
				}
			}
			if !known && isTarget < 0 {
				b = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RCode: dnsmessage.RCodeNameError})
			}
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
			switch {
			case known:
				for i, port := range ports {
					_ = b.SRVResource(hdr, dnsmessage.SRVResource{Priority: 0, Weight: 10, Port: uint16(port), Target: target(i)})
				}
			case isTarget >= 0:
				_ = b.AResource(hdr, dnsmessage.AResource{A: netip.MustParseAddr("127.0.0.1").As4()})
			}
			msg, err := b.Finish()
			if err == nil {
				_, _ = pc.WriteTo(msg, addr)
			}
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// NewShardedSRV finds the shards a headless Service publishes and talks
// to them.
func TestShardedSRV(t *testing.T) {
	var ports []int
	for range 3 {
		ts, _ := newServer(t, nil)
		_, p, _ := net.SplitHostPort(ts.Listener.Addr().String())
		port, _ := strconv.Atoi(p)
		ports = append(ports, port)
	}
	const name = "_http._tcp.rbd.test"
	r := fakeDNS(t, name, ports)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := client.NewShardedSRV(ctx, name, &client.ShardedOptions{Resolver: r})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, p := range ports {
		want = append(want, "http://rbd-"+strconv.Itoa(i)+".rbd.test:"+strconv.Itoa(p))
	}
	slices.Sort(want)
	if got := s.Shards(); !slices.Equal(got, want) {
		t.Fatalf("shards %v, want %v", got, want)
	}
	if _, err := client.NewShardedSRV(ctx, "_http._tcp.nothing.test", &client.ShardedOptions{Resolver: r}); err == nil {
		t.Fatal("an SRV name with no records gave a client")
	}
	// Through those names the shards take writes and answer samples (the
	// shard clients dial with the same resolver).
	hc := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{Resolver: r}).DialContext}}
	s, err = client.NewShardedSRV(ctx, name, &client.ShardedOptions{Resolver: r, Client: &client.Options{HTTPClient: hc}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateBuffer(ctx, "b", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	for k := range 6 {
		if _, err := s.Extend(ctx, "b", "actor-"+strconv.Itoa(k), steps(seqToks(int64(10*k), 10), make([]bool, 10), nil)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := s.Sample(ctx, "b", &client.SampleRequest{BatchSize: 32})
	if err != nil || b.Rows() != 32 {
		t.Fatalf("sample through SRV-found shards: %v", err)
	}
}
