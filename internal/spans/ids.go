package spans

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// IDGenerator decides trace and span ids. gymtrace decides every id itself
// (never the OTel SDK) so that the ids it joins on, injects and exports agree.
type IDGenerator interface {
	NewTraceID() trace.TraceID
	NewSpanID() trace.SpanID
}

// randomIDs draws ids from ChaCha8 seeded by the kernel's CSPRNG: as
// unpredictable as crypto/rand, without a getrandom call per span.
type randomIDs struct {
	mu sync.Mutex
	r  *rand.ChaCha8
}

// NewRandomIDs returns the production IDGenerator. It is safe for concurrent use.
func NewRandomIDs() (IDGenerator, error) {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("seeding the span id generator from crypto/rand: %w", err)
	}
	return &randomIDs{r: rand.NewChaCha8(seed)}, nil
}

func (g *randomIDs) NewTraceID() trace.TraceID {
	var id trace.TraceID
	g.mu.Lock()
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], g.r.Uint64())
		binary.BigEndian.PutUint64(id[8:], g.r.Uint64())
	}
	g.mu.Unlock()
	return id
}

func (g *randomIDs) NewSpanID() trace.SpanID {
	var id trace.SpanID
	g.mu.Lock()
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], g.r.Uint64())
	}
	g.mu.Unlock()
	return id
}

// SequentialIDs is a deterministic IDGenerator for tests: trace ids
// 0…01, 0…02, … and span ids 1, 2, … in call order.
type SequentialIDs struct {
	mu           sync.Mutex
	trace, spans uint64
}

func (g *SequentialIDs) NewTraceID() trace.TraceID {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.trace++
	var id trace.TraceID
	binary.BigEndian.PutUint64(id[8:], g.trace)
	return id
}

func (g *SequentialIDs) NewSpanID() trace.SpanID {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.spans++
	var id trace.SpanID
	binary.BigEndian.PutUint64(id[:], g.spans)
	return id
}
