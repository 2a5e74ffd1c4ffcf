package daemon

import (
	"sync"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
)

// Broker fans lifecycle events out to subscribers (GET /v1/events). A subscriber that
// falls more than its buffer behind is dropped (its channel closed) rather than slowing
// the operations that publish.
type Broker struct {
	mu   sync.Mutex
	subs map[chan client.Event]struct{}
}

// NewBroker returns an empty broker.
func NewBroker() *Broker { return &Broker{subs: map[chan client.Event]struct{}{}} }

// Publish sends e to every subscriber.
func (b *Broker) Publish(e client.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- e:
		default:
			delete(b.subs, ch)
			close(ch)
		}
	}
}

// Subscribe returns a channel of events and a function that ends the subscription.
func (b *Broker) Subscribe() (<-chan client.Event, func()) {
	ch := make(chan client.Event, 256)
	b.mu.Lock()
	b.subs[ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.subs[ch]; ok {
			delete(b.subs, ch)
			close(ch)
		}
	}
}
