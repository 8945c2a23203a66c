// natsbench: the load generator for nats-server used by `skiff bench
// pubsub --nats`, `skiff bench request --nats` (bench/pubsub.sh) and
// bench/mesh.sh. It applies the same load shapes as skiff's benchmarks and
// prints one JSON object per result, with the fields of skiff's bench rows.
//
//	natsbench pubsub  -url nats://127.0.0.1:4222 -pubs 1 -subs 4 -size 256 -duration 2s
//	natsbench pubsub  -pub-url nats://127.0.0.1:4222 -sub-url nats://127.0.0.1:4223 -latency
//	natsbench request -url nats://127.0.0.1:4222 -conc 16 -size 8 -duration 2s
//	natsbench request -pub-url nats://A -sub-url nats://B -sub-url nats://C -queue svc
//
// -pub-url is where publishers (requesters) connect, -sub-url (repeatable)
// where subscribers (responders) connect, spread over the URLs in turn;
// both default to -url. Before timing, the publisher sends empty probe
// messages until every subscriber has one, so interest has crossed the
// cluster's routes. -latency sends one message at a time and times it
// from publish to its arrival at every subscriber. In request mode there
// is one responder per -sub-url; with -queue they form a queue group (one
// of them answers each request).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

type row struct {
	Test     string   `json:"test"`
	Mode     string   `json:"mode"`
	Size     int      `json:"size"`
	Messages uint64   `json:"messages"`
	MsgsPerS *float64 `json:"msgs_per_s"`
	MBPerS   *float64 `json:"mb_per_s"`
	P50us    *float64 `json:"p50_us"`
	P99us    *float64 `json:"p99_us"`
	Lost     *uint64  `json:"lost,omitempty"`
	Dropped  *uint64  `json:"dropped,omitempty"`
	Elapsed  *float64 `json:"elapsed_s,omitempty"`
	Options  string   `json:"options,omitempty"`
}

func f(v float64) *float64 { return &v }
func u(v uint64) *uint64   { return &v }

func die(err error) {
	fmt.Fprintln(os.Stderr, "natsbench:", err)
	os.Exit(1)
}

// urls is a repeatable flag.
type urls []string

func (l *urls) String() string     { return strings.Join(*l, " ") }
func (l *urls) Set(s string) error { *l = append(*l, s); return nil }

// where clients connect.
type where struct {
	pub  string
	subs []string
}

func (w where) sub(i int) string { return w.subs[i%len(w.subs)] }

func (w where) String() string {
	return fmt.Sprintf("pub=%s sub=%s", w.pub, strings.Join(w.subs, ","))
}

// connect dials url; with NATS_CA set (a PEM file) the connection is TLS
// and trusts that CA (bench/security.sh).
func connect(url string) *nats.Conn {
	var opts []nats.Option
	if ca := os.Getenv("NATS_CA"); ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		die(fmt.Errorf("%s: %w", url, err))
	}
	return nc
}

func main() {
	if len(os.Args) < 2 {
		die(fmt.Errorf("usage: natsbench pubsub|request [flags]"))
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	url := fs.String("url", nats.DefaultURL, "server (default of -pub-url and -sub-url)")
	pubURL := fs.String("pub-url", "", "where publishers / the requester connect")
	var subURLs urls
	fs.Var(&subURLs, "sub-url", "where subscribers / responders connect (repeatable; spread in turn)")
	pubs := fs.Int("pubs", 1, "publishers")
	subs := fs.Int("subs", 1, "subscribers")
	conc := fs.Int("conc", 1, "concurrent requesters")
	size := fs.Int("size", 8, "payload bytes")
	dur := fs.Duration("duration", 2*time.Second, "how long to send")
	max := fs.Uint64("messages", 5_000_000, "most messages per publisher")
	latency := fs.Bool("latency", false, "pubsub: one message at a time, publish-to-arrival latency")
	queue := fs.String("queue", "", "request: responders form this queue group")
	conns := fs.String("conns", "one", "request: one (every requester on one connection) or per-requester (each its own, as `nats bench` does)")
	fs.Parse(os.Args[2:])
	w := where{pub: *pubURL, subs: subURLs}
	if w.pub == "" {
		w.pub = *url
	}
	if len(w.subs) == 0 {
		w.subs = []string{*url}
	}
	if *size < 1 {
		die(fmt.Errorf("-size must be at least 1 (empty messages are probes)"))
	}
	var r row
	switch os.Args[1] {
	case "pubsub":
		if *latency {
			r = pubsubLatency(w, *subs, *size, *dur)
		} else {
			r = pubsub(w, *pubs, *subs, *size, *dur, *max)
		}
	case "request":
		if *conns != "one" && *conns != "per-requester" {
			die(fmt.Errorf("-conns must be one or per-requester"))
		}
		r = request(w, *conc, *size, *dur, *queue, *conns == "per-requester")
	default:
		die(fmt.Errorf("unknown test %q", os.Args[1]))
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

// probe publishes empty messages on subject from nc until ready says every
// subscriber has seen one.
func probe(nc *nats.Conn, subject string, ready func() bool) {
	deadline := time.Now().Add(10 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			die(fmt.Errorf("subscribers got no probe on %s within 10 s: are the servers routed?", subject))
		}
		if err := nc.Publish(subject, nil); err != nil {
			die(err)
		}
		nc.Flush()
		time.Sleep(5 * time.Millisecond)
	}
}

func pubsub(w where, pubs, subs, size int, dur time.Duration, max uint64) row {
	var received, dropped, probed atomic.Uint64
	var last atomic.Int64
	var conns []*nats.Conn
	var subscriptions []*nats.Subscription
	for i := 0; i < subs; i++ {
		nc := connect(w.sub(i))
		conns = append(conns, nc)
		var seen atomic.Bool
		s, err := nc.Subscribe("bench.ps", func(m *nats.Msg) {
			if len(m.Data) == 0 {
				if !seen.Swap(true) {
					probed.Add(1)
				}
				return
			}
			received.Add(1)
			last.Store(time.Now().UnixNano())
		})
		if err != nil {
			die(err)
		}
		s.SetPendingLimits(65536, 64<<20)
		nc.Flush()
		subscriptions = append(subscriptions, s)
	}
	var pubConns []*nats.Conn
	for p := 0; p < pubs; p++ {
		nc := connect(w.pub)
		conns = append(conns, nc)
		pubConns = append(pubConns, nc)
	}
	probe(pubConns[0], "bench.ps", func() bool { return probed.Load() == uint64(subs) })
	payload := make([]byte, size)
	var sent atomic.Uint64
	var wg sync.WaitGroup
	start := time.Now()
	for _, nc := range pubConns {
		wg.Add(1)
		go func(nc *nats.Conn) {
			defer wg.Done()
			deadline := start.Add(dur)
			var n uint64
			for n < max {
				if n%1024 == 0 && time.Now().After(deadline) {
					break
				}
				if err := nc.Publish("bench.ps", payload); err != nil {
					die(err)
				}
				n++
			}
			nc.Flush()
			sent.Add(n)
		}(nc)
	}
	wg.Wait()
	want := sent.Load() * uint64(subs)
	// Wait for the rest, until nothing arrives for 300 ms.
	for received.Load() < want {
		before := received.Load()
		time.Sleep(300 * time.Millisecond)
		if received.Load() == before {
			break
		}
	}
	elapsed := time.Duration(last.Load() - start.UnixNano())
	got := received.Load()
	// Dropped by nats.go as slow consumers (its pending limits), read
	// before the connections close (a deferred read came after the row
	// was made, so it always said 0).
	for _, s := range subscriptions {
		d, _ := s.Dropped()
		dropped.Add(uint64(d))
	}
	for _, c := range conns {
		c.Close()
	}
	rate := float64(got) / elapsed.Seconds()
	return row{
		Test: "nats", Mode: fmt.Sprintf("%dx%d", pubs, subs), Size: size,
		Messages: sent.Load(), MsgsPerS: f(rate), MBPerS: f(rate * float64(size) / 1e6),
		Lost: u(want - got), Dropped: u(dropped.Load()), Elapsed: f(elapsed.Seconds()),
		Options: w.String(),
	}
}

// quantiles of sorted latencies, in microseconds.
func quantile(lat []time.Duration, p float64) *float64 {
	if len(lat) == 0 {
		return nil
	}
	return f(float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3)
}

// pubsubLatency publishes one message at a time and waits until every
// subscriber has it: publish-to-arrival latency across the servers.
func pubsubLatency(w where, subs, size int, dur time.Duration) row {
	var probed atomic.Uint64
	arrived := make(chan struct{}, subs*4)
	var conns []*nats.Conn
	for i := 0; i < subs; i++ {
		nc := connect(w.sub(i))
		conns = append(conns, nc)
		var seen atomic.Bool
		if _, err := nc.Subscribe("bench.lat", func(m *nats.Msg) {
			if len(m.Data) == 0 {
				if !seen.Swap(true) {
					probed.Add(1)
				}
				return
			}
			arrived <- struct{}{}
		}); err != nil {
			die(err)
		}
		nc.Flush()
	}
	pub := connect(w.pub)
	conns = append(conns, pub)
	probe(pub, "bench.lat", func() bool { return probed.Load() == uint64(subs) })
	payload := make([]byte, size)
	one := func() time.Duration {
		t := time.Now()
		if err := pub.Publish("bench.lat", payload); err != nil {
			die(err)
		}
		for i := 0; i < subs; i++ {
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				die(fmt.Errorf("a message did not arrive within 5 s"))
			}
		}
		return time.Since(t)
	}
	// Warm up: 1000 messages or a tenth of the duration.
	for t, i := time.Now(), 0; i < 1000 && time.Since(t) < dur/10; i++ {
		one()
	}
	var lat []time.Duration
	start := time.Now()
	for time.Since(start) < dur {
		lat = append(lat, one())
	}
	elapsed := time.Since(start)
	for _, c := range conns {
		c.Close()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	rate := float64(len(lat)) / elapsed.Seconds()
	return row{
		Test: "nats", Mode: fmt.Sprintf("1x%d-latency", subs), Size: size,
		Messages: uint64(len(lat)), MsgsPerS: f(rate), MBPerS: f(rate * float64(size) / 1e6),
		P50us: quantile(lat, 0.50), P99us: quantile(lat, 0.99), Elapsed: f(elapsed.Seconds()),
		Options: w.String(),
	}
}

// request times requests from conc requesters: all on one connection, or
// (perConn) each on a connection of its own.
func request(w where, conc, size int, dur time.Duration, queue string, perConn bool) row {
	for _, url := range w.subs {
		srv := connect(url)
		defer srv.Close()
		respond := func(m *nats.Msg) { m.Respond(m.Data) }
		var err error
		if queue != "" {
			_, err = srv.QueueSubscribe("bench.req", queue, respond)
		} else {
			_, err = srv.Subscribe("bench.req", respond)
		}
		if err != nil {
			die(err)
		}
		srv.Flush()
	}
	nc := connect(w.pub)
	defer nc.Close()
	// The connection each requester uses.
	ncs := make([]*nats.Conn, conc)
	for c := range ncs {
		ncs[c] = nc
		if perConn && c > 0 {
			ncs[c] = connect(w.pub)
			defer ncs[c].Close()
		}
	}
	payload := make([]byte, size)
	// Warm up; the first requests may find no route to a responder yet.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 1000; i++ {
		if _, err := nc.Request("bench.req", payload, 5*time.Second); err != nil {
			if err == nats.ErrNoResponders && time.Now().Before(deadline) {
				i--
				time.Sleep(5 * time.Millisecond)
				continue
			}
			die(err)
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func(nc *nats.Conn) {
			defer wg.Done()
			var mine []time.Duration
			for time.Since(start) < dur {
				t := time.Now()
				if _, err := nc.Request("bench.req", payload, 5*time.Second); err != nil {
					die(err)
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}(ncs[c])
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	rate := float64(len(lat)) / elapsed.Seconds()
	opts := w.String()
	if perConn {
		opts += " conns=per-requester"
	}
	if queue != "" {
		opts += " queue=" + queue
	}
	return row{
		Test: "nats-request", Mode: fmt.Sprintf("conc=%d", conc), Size: size,
		Messages: uint64(len(lat)), MsgsPerS: f(rate), MBPerS: f(rate * float64(size) / 1e6),
		P50us: quantile(lat, 0.50), P99us: quantile(lat, 0.99), Elapsed: f(elapsed.Seconds()),
		Options: opts,
	}
}
