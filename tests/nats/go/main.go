// natsgo-suite: nats.go (Go module proxy) against skiff nodes' NATS
// listeners, run by tests/nats/run.sh with the environment it documents
// (NATS_A, NATS_B meshed; SKIFF_A, SKIFF_B; SKIFF; NATS_C, NATS_D, KILL_C).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// A key made for this test alone (its public key is in tests/nats/run.sh).
const testSeed = "SUAABDEBMY4Z2O3ZGTY5S5UAXNLXIXG2RIOFW6XUCF2BMOIWV4HWYU2CGU"

var passed int

func check(ok bool, format string, args ...any) {
	if !ok {
		fmt.Printf("FAIL nats.go: "+format+"\n", args...)
		os.Exit(1)
	}
	passed++
}

func must(err error) {
	if err != nil {
		fmt.Println("FAIL nats.go:", err)
		os.Exit(1)
	}
}

func until(pred func() bool, what string) {
	for i := 0; i < 200; i++ {
		if pred() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	check(false, "timed out: %s", what)
}

// box collects messages from a subscription callback.
type box struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (b *box) add(m *nats.Msg) { b.mu.Lock(); b.msgs = append(b.msgs, m); b.mu.Unlock() }
func (b *box) n() int         { b.mu.Lock(); defer b.mu.Unlock(); return len(b.msgs) }
func (b *box) all() []*nats.Msg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*nats.Msg(nil), b.msgs...)
}

func collect(nc *nats.Conn, subject, queue string) (*nats.Subscription, *box) {
	b := &box{}
	var s *nats.Subscription
	var err error
	if queue == "" {
		s, err = nc.Subscribe(subject, b.add)
	} else {
		s, err = nc.QueueSubscribe(subject, queue, b.add)
	}
	must(err)
	must(nc.Flush())
	return s, b
}

func skiff(args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, os.Getenv("SKIFF"), args...).Output()
	must(err)
	return string(out)
}

func local(nc *nats.Conn) {
	_, star := collect(nc, "go.*.x", "")
	_, tail := collect(nc, "go.>", "")
	for _, s := range []string{"go.a.x", "go.b.x", "go.a.y", "other"} {
		must(nc.Publish(s, []byte(s)))
	}
	until(func() bool { return star.n() == 2 && tail.n() == 3 }, "wildcards")

	_, q1 := collect(nc, "go.q", "workers")
	_, q2 := collect(nc, "go.q", "workers")
	for i := 0; i < 100; i++ {
		must(nc.Publish("go.q", []byte(strconv.Itoa(i))))
	}
	until(func() bool { return q1.n()+q2.n() == 100 }, "queue group")
	check(q1.n() > 0 && q2.n() > 0, "both queue members got messages (%d, %d)", q1.n(), q2.n())
	var seen []int
	for _, m := range append(q1.all(), q2.all()...) {
		i, _ := strconv.Atoi(string(m.Data))
		seen = append(seen, i)
	}
	sort.Ints(seen)
	for i, v := range seen {
		check(i == v, "each message once to the group")
	}

	_, err := nc.Subscribe("go.svc", func(m *nats.Msg) { m.Respond(append([]byte("re:"), m.Data...)) })
	must(err)
	r, err := nc.Request("go.svc", []byte("one"), 3*time.Second)
	must(err)
	check(string(r.Data) == "re:one", "request/reply: %q", r.Data)
	_, err = nc.Request("nobody.go", []byte("x"), 3*time.Second)
	check(errors.Is(err, nats.ErrNoResponders), "no responders: %v", err)

	_, h := collect(nc, "go.h", "")
	msg := nats.NewMsg("go.h")
	msg.Header.Set("Trace-Id", "abc")
	msg.Header.Add("Multi", "1")
	msg.Header.Add("Multi", "2")
	msg.Data = []byte("b")
	must(nc.PublishMsg(msg))
	until(func() bool { return h.n() == 1 }, "headers")
	got := h.all()[0].Header
	check(got.Get("Trace-Id") == "abc" && len(got.Values("Multi")) == 2, "headers kept: %v", got)

	s, mx := collect(nc, "go.max", "")
	must(s.AutoUnsubscribe(3))
	for i := 0; i < 10; i++ {
		must(nc.Publish("go.max", []byte("m")))
	}
	must(nc.Flush())
	time.Sleep(300 * time.Millisecond)
	check(mx.n() == 3, "UNSUB 3 delivered %d", mx.n())

	big := make([]byte, 1000*1000)
	rand.Read(big)
	_, b := collect(nc, "go.big", "")
	must(nc.Publish("go.big", big))
	until(func() bool { return b.n() == 1 }, "large payload")
	check(bytes.Equal(b.all()[0].Data, big), "large payload intact")

	nc2, err := nats.Connect(os.Getenv("NATS_A"))
	must(err)
	_, d := collect(nc2, "go.drain", "")
	for i := 0; i < 50; i++ {
		must(nc.Publish("go.drain", []byte("d")))
	}
	must(nc.Flush())
	time.Sleep(200 * time.Millisecond)
	must(nc2.Drain())
	until(func() bool { return nc2.IsClosed() }, "drain closes")
	check(d.n() == 50, "drain delivered %d of 50", d.n())
}

func interop(nc *nats.Conn) {
	a := os.Getenv("SKIFF_A")
	_, got := collect(nc, "go.s2n", "")
	skiff("pub", "-n", a, "go.s2n", "from-skiff", "--type", "greet")
	until(func() bool { return got.n() == 1 }, "skiff pub -> nats sub")
	m := got.all()[0]
	check(string(m.Data) == "from-skiff" && m.Header.Get("Skiff-Type") == "greet", "skiff message with its type: %q %v", m.Data, m.Header)

	cmd := exec.Command(os.Getenv("SKIFF"), "sub", "-n", a, "go.n2s", "--count", "1")
	var out bytes.Buffer
	cmd.Stdout = &out
	must(cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for i := 0; i < 200; i++ {
		must(nc.Publish("go.n2s", []byte("from-nats")))
		select {
		case <-done:
			i = 200
		case <-time.After(25 * time.Millisecond):
		}
	}
	check(strings.Contains(out.String(), "from-nats"), "nats pub -> skiff sub: %q", out.String())

	_, err := nc.Subscribe("go.ask-nats", func(m *nats.Msg) { m.Respond([]byte("nats-answer")) })
	must(err)
	must(nc.Flush())
	res := skiff("req", "-n", a, "go.ask-nats", "q")
	check(strings.Contains(res, "nats-answer"), "skiff req -> nats: %q", res)

	rep := exec.Command(os.Getenv("SKIFF"), "reply", "-n", a, "go.ask-skiff", "skiff-answer", "--count", "1")
	must(rep.Start())
	var r *nats.Msg
	for i := 0; i < 100 && r == nil; i++ {
		r, _ = nc.Request("go.ask-skiff", []byte("q"), time.Second)
	}
	check(r != nil && string(r.Data) == "skiff-answer", "nats req -> skiff reply")
	rep.Wait()
}

func mesh() {
	a, err := nats.Connect(os.Getenv("NATS_A"))
	must(err)
	b, err := nats.Connect(os.Getenv("NATS_B"))
	must(err)
	_, got := collect(b, "go.mesh", "")
	_, err = b.Subscribe("go.mesh.svc", func(m *nats.Msg) { m.Respond([]byte("from-b")) })
	must(err)
	must(b.Flush())
	for i := 0; i < 200 && got.n() == 0; i++ {
		must(a.Publish("go.mesh", []byte("x")))
		time.Sleep(25 * time.Millisecond)
	}
	check(got.n() > 0, "nats A -> nats B across the mesh")
	var r *nats.Msg
	for i := 0; i < 100 && r == nil; i++ {
		r, _ = a.Request("go.mesh.svc", []byte("q"), time.Second)
		if r == nil {
			time.Sleep(25 * time.Millisecond)
		}
	}
	check(r != nil && string(r.Data) == "from-b", "request across the mesh")
	_, s2n := collect(b, "go.mesh.s2n", "")
	for i := 0; i < 100 && s2n.n() == 0; i++ {
		skiff("pub", "-n", os.Getenv("SKIFF_A"), "go.mesh.s2n", "m")
		time.Sleep(25 * time.Millisecond)
	}
	check(s2n.n() > 0, "skiff A -> nats B")
	a.Close()
	b.Close()
}

func reconnect() {
	re := make(chan struct{}, 1)
	nc, err := nats.Connect(os.Getenv("NATS_C")+","+os.Getenv("NATS_D"), nats.DontRandomize(),
		nats.ReconnectWait(100*time.Millisecond), nats.MaxReconnects(50),
		nats.ReconnectHandler(func(*nats.Conn) { re <- struct{}{} }))
	must(err)
	_, got := collect(nc, "go.re", "")
	pid, _ := strconv.Atoi(os.Getenv("KILL_C"))
	must(syscall.Kill(pid, syscall.SIGKILL))
	select {
	case <-re:
	case <-time.After(10 * time.Second):
		check(false, "no reconnect")
	}
	check(nc.ConnectedUrl() == os.Getenv("NATS_D"), "reconnected to the second node: %s", nc.ConnectedUrl())
	must(nc.Publish("go.re", []byte("after")))
	until(func() bool { return got.n() > 0 }, "subscription restored after reconnect")
	nc.Close()
}

// secure: NATS_TLS requires TLS after INFO, NATS_TLS_FIRST wants TLS
// first; both have a certificate from the CA in NATS_CA.
func secure() {
	url, ca := os.Getenv("NATS_TLS"), os.Getenv("NATS_CA")
	_, err := nats.Connect(url, nats.MaxReconnects(0))
	check(err != nil, "a client not trusting the node's CA fails on a TLS port: %v", err)
	nc, err := nats.Connect(url, nats.RootCAs(ca), nats.Secure())
	must(err)
	st, err := nc.TLSConnectionState()
	must(err)
	check(st.HandshakeComplete, "TLS handshake complete")
	_, got := collect(nc, "go.tls.*", "")
	_, err = nc.Subscribe("go.tlssvc", func(m *nats.Msg) { m.Respond(append([]byte("tls:"), m.Data...)) })
	must(err)
	must(nc.Publish("go.tls.x", []byte("secret")))
	until(func() bool { return got.n() == 1 }, "publish/subscribe over TLS")
	check(string(got.all()[0].Data) == "secret", "payload over TLS")
	r, err := nc.Request("go.tlssvc", []byte("q"), 3*time.Second)
	must(err)
	check(string(r.Data) == "tls:q", "request over TLS: %q", r.Data)
	nc.Close()

	first, err := nats.Connect(os.Getenv("NATS_TLS_FIRST"), nats.RootCAs(ca), nats.TLSHandshakeFirst())
	must(err)
	_, got = collect(first, "go.first", "")
	must(first.Publish("go.first", []byte("f")))
	until(func() bool { return got.n() == 1 }, "handshake_first")
	first.Close()
}

// meshQueue: queue subscribers on both meshed nodes (one on A, three on
// B): each message reaches the group once in the whole mesh, spread by
// the nodes' capacity (B weighs 3, A 1).
func meshQueue() {
	a, err := nats.Connect(os.Getenv("NATS_A"))
	must(err)
	conns := []*nats.Conn{a}
	for i := 0; i < 3; i++ {
		b, err := nats.Connect(os.Getenv("NATS_B"))
		must(err)
		conns = append(conns, b)
	}
	var boxes []*box
	for _, c := range conns {
		_, bx := collect(c, "go.mq", "mq")
		boxes = append(boxes, bx)
	}
	_, plainB := collect(conns[1], "go.mq", "")
	// Until A knows B's members: a probe reaches B's plain subscriber.
	pub, err := nats.Connect(os.Getenv("NATS_A"))
	must(err)
	_, probe := collect(conns[1], "go.mq.probe", "")
	for i := 0; i < 200 && probe.n() == 0; i++ {
		must(pub.Publish("go.mq.probe", []byte("p")))
		time.Sleep(25 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	const n = 400
	for _, bx := range boxes {
		bx.mu.Lock()
		bx.msgs = nil
		bx.mu.Unlock()
	}
	plainB.mu.Lock()
	plainB.msgs = nil
	plainB.mu.Unlock()
	for i := 0; i < n; i++ {
		must(pub.Publish("go.mq", []byte(strconv.Itoa(i))))
	}
	must(pub.Flush())
	total := func() int {
		t := 0
		for _, bx := range boxes {
			t += bx.n()
		}
		return t
	}
	until(func() bool { return total() >= n && plainB.n() == n }, "queue group across the mesh")
	time.Sleep(300 * time.Millisecond)
	seen := map[string]int{}
	for _, bx := range boxes {
		for _, m := range bx.all() {
			seen[string(m.Data)]++
		}
	}
	check(total() == n && len(seen) == n, "each message once to the group across the mesh: %d copies of %d messages", total(), len(seen))
	onA := boxes[0].n()
	check(onA >= n/10 && onA <= n*2/5, "A's member got %d of %d (B's three: %d %d %d)", onA, n, boxes[1].n(), boxes[2].n(), boxes[3].n())
	check(plainB.n() == n, "a plain subscriber gets every message: %d", plainB.n())

	// Requests to a queue group: one member in the whole mesh is handed
	// each (weighted as publishes are) and its reply crosses back; no
	// responders only when no member is left anywhere.
	var mu sync.Mutex
	handed := make([]int, len(conns))
	seenReq := map[string]int{}
	var rsubs []*nats.Subscription
	for i, c := range conns {
		i := i
		s, err := c.QueueSubscribe("go.mqr", "mqr", func(m *nats.Msg) {
			mu.Lock()
			handed[i]++
			seenReq[string(m.Data)]++
			mu.Unlock()
			_ = m.Respond(m.Data)
		})
		must(err)
		must(c.Flush())
		rsubs = append(rsubs, s)
	}
	_, probe2 := collect(conns[1], "go.mqr.probe", "")
	for i := 0; i < 200 && probe2.n() == 0; i++ {
		must(pub.Publish("go.mqr.probe", []byte("p")))
		time.Sleep(25 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	const nr = 200
	for i := 0; i < nr; i++ {
		r, err := pub.Request("go.mqr", []byte(strconv.Itoa(i)), 5*time.Second)
		must(err)
		check(string(r.Data) == strconv.Itoa(i), "the reply to request %d", i)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	twice := 0
	for _, k := range seenReq {
		if k != 1 {
			twice++
		}
	}
	check(len(seenReq) == nr && twice == 0, "each request to one member of the group across the mesh: %d requests, %d more than once (handed %v)", len(seenReq), twice, handed)
	check(handed[0] >= nr/10 && handed[0] <= nr*2/5, "A's member was handed %d of %d requests: %v", handed[0], nr, handed)
	mu.Unlock()
	for _, s := range rsubs {
		must(s.Unsubscribe())
	}
	for _, c := range conns {
		must(c.Flush())
	}
	var err2 error
	for i := 0; i < 200; i++ {
		_, err2 = pub.Request("go.mqr", []byte("x"), 2*time.Second)
		if errors.Is(err2, nats.ErrNoResponders) {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	check(errors.Is(err2, nats.ErrNoResponders), "no responders once the group has no member: %v", err2)
	for _, c := range append(conns, pub) {
		c.Close()
	}
}

// auth: NATS_AUTH is a node with users (see tests/nats/run.sh).
func auth() {
	url := os.Getenv("NATS_AUTH")
	_, err := nats.Connect(url)
	check(err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization violation"), "no credentials refused: %v", err)
	_, err = nats.Connect(url, nats.Token("nope"))
	check(err != nil, "a wrong token refused")
	_, err = nats.Connect(url, nats.UserInfo("alice", "nope"))
	check(err != nil, "a wrong password refused")

	tok, err := nats.Connect(url, nats.Token("tok"))
	must(err)
	_, got := collect(tok, "alice.>", "")

	denied := make(chan error, 4)
	alice, err := nats.Connect(url, nats.UserInfo("alice", "alice-pw"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, e error) { denied <- e }))
	must(err)
	must(alice.Publish("alice.x", []byte("ok")))
	must(alice.Publish("bob.x", []byte("no")))
	must(alice.Flush())
	select {
	case e := <-denied:
		check(strings.Contains(e.Error(), "Permissions Violation for Publish"), "permission error: %v", e)
	case <-time.After(5 * time.Second):
		check(false, "no permissions violation reported")
	}
	until(func() bool { return got.n() == 1 }, "alice's allowed publish")
	check(!alice.IsClosed(), "a permissions violation does not close the connection")

	kp, err := nkeys.FromSeed([]byte(testSeed))
	must(err)
	pub, _ := kp.PublicKey()
	svc, err := nats.Connect(url, nats.Nkey(pub, kp.Sign))
	check(err == nil, "nkey (Ed25519 nonce signature) accepted: %v", err)
	must(svc.Publish("alice.svc", []byte("k")))
	until(func() bool { return got.n() == 2 }, "the nkey user's publish")
	other, _ := nkeys.CreateUser()
	opub, _ := other.PublicKey()
	_, err = nats.Connect(url, nats.Nkey(opub, other.Sign))
	check(err != nil, "an unknown key refused")
	_, err = nats.Connect(url, nats.Nkey(pub, other.Sign))
	check(err != nil, "a signature by another key refused")
	svc.Close()
	alice.Close()
	tok.Close()
}

func main() {
	nc, err := nats.Connect(os.Getenv("NATS_A"))
	must(err)
	local(nc)
	interop(nc)
	nc.Close()
	mesh()
	meshQueue()
	secure()
	auth()
	reconnect()
	fmt.Printf("nats.go: %d checks passed\n", passed)
}
