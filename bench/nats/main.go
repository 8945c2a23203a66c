// natsbench: the load generator for nats-server used by `skiff bench
// pubsub --nats` and `skiff bench request --nats` (bench/pubsub.sh). It
// applies the same load shapes as skiff's benchmarks and prints one JSON
// object per result, with the fields of skiff's bench rows.
//
//	natsbench pubsub  -url nats://127.0.0.1:4222 -pubs 1 -subs 4 -size 256 -duration 2s
//	natsbench request -url nats://127.0.0.1:4222 -conc 16 -size 8 -duration 2s
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
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

func main() {
	if len(os.Args) < 2 {
		die(fmt.Errorf("usage: natsbench pubsub|request [flags]"))
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	url := fs.String("url", nats.DefaultURL, "server")
	pubs := fs.Int("pubs", 1, "publishers")
	subs := fs.Int("subs", 1, "subscribers")
	conc := fs.Int("conc", 1, "concurrent requesters")
	size := fs.Int("size", 8, "payload bytes")
	dur := fs.Duration("duration", 2*time.Second, "how long to send")
	max := fs.Uint64("messages", 5_000_000, "most messages per publisher")
	fs.Parse(os.Args[2:])
	var r row
	switch os.Args[1] {
	case "pubsub":
		r = pubsub(*url, *pubs, *subs, *size, *dur, *max)
	case "request":
		r = request(*url, *conc, *size, *dur)
	default:
		die(fmt.Errorf("unknown test %q", os.Args[1]))
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func pubsub(url string, pubs, subs, size int, dur time.Duration, max uint64) row {
	var received, dropped atomic.Uint64
	var last atomic.Int64
	var conns []*nats.Conn
	for i := 0; i < subs; i++ {
		nc, err := nats.Connect(url)
		if err != nil {
			die(err)
		}
		conns = append(conns, nc)
		s, err := nc.Subscribe("bench.ps", func(m *nats.Msg) {
			received.Add(1)
			last.Store(time.Now().UnixNano())
		})
		if err != nil {
			die(err)
		}
		s.SetPendingLimits(65536, 64<<20)
		nc.Flush()
		defer func(s *nats.Subscription) {
			d, _ := s.Dropped()
			dropped.Add(uint64(d))
		}(s)
	}
	payload := make([]byte, size)
	var sent atomic.Uint64
	var wg sync.WaitGroup
	start := time.Now()
	for p := 0; p < pubs; p++ {
		nc, err := nats.Connect(url)
		if err != nil {
			die(err)
		}
		conns = append(conns, nc)
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
	for _, c := range conns {
		c.Close()
	}
	rate := float64(got) / elapsed.Seconds()
	return row{
		Test: "nats", Mode: fmt.Sprintf("%dx%d", pubs, subs), Size: size,
		Messages: sent.Load(), MsgsPerS: f(rate), MBPerS: f(rate * float64(size) / 1e6),
		Lost: u(want - got), Dropped: u(dropped.Load()), Elapsed: f(elapsed.Seconds()),
		Options: url,
	}
}

func request(url string, conc, size int, dur time.Duration) row {
	srv, err := nats.Connect(url)
	if err != nil {
		die(err)
	}
	defer srv.Close()
	srv.Subscribe("bench.req", func(m *nats.Msg) { m.Respond(m.Data) })
	srv.Flush()
	nc, err := nats.Connect(url)
	if err != nil {
		die(err)
	}
	defer nc.Close()
	payload := make([]byte, size)
	// Warm up.
	for i := 0; i < 1000; i++ {
		if _, err := nc.Request("bench.req", payload, 5*time.Second); err != nil {
			die(err)
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func() {
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
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) *float64 {
		if len(lat) == 0 {
			return nil
		}
		return f(float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3)
	}
	rate := float64(len(lat)) / elapsed.Seconds()
	return row{
		Test: "nats-request", Mode: fmt.Sprintf("conc=%d", conc), Size: size,
		Messages: uint64(len(lat)), MsgsPerS: f(rate), MBPerS: f(rate * float64(size) / 1e6),
		P50us: q(0.50), P99us: q(0.99), Elapsed: f(elapsed.Seconds()), Options: url,
	}
}
