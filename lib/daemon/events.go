package daemon

import (
	"sync"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
)

// fanout sends values to subscribers. A subscriber that falls more than its buffer
// behind is dropped (its channel closed) rather than slowing the operations that publish.
type fanout[T any] struct {
	mu   sync.Mutex
	subs map[chan T]struct{}
}

func (f *fanout[T]) publish(v T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.subs {
		select {
		case ch <- v:
		default:
			delete(f.subs, ch)
			close(ch)
		}
	}
}

func (f *fanout[T]) subscribe() (<-chan T, func()) {
	ch := make(chan T, 256)
	f.mu.Lock()
	if f.subs == nil {
		f.subs = map[chan T]struct{}{}
	}
	f.subs[ch] = struct{}{}
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.subs[ch]; ok {
			delete(f.subs, ch)
			close(ch)
		}
	}
}

// Broker fans lifecycle events out to subscribers (GET /v1/events).
type Broker struct{ f fanout[client.Event] }

// NewBroker returns an empty broker.
func NewBroker() *Broker { return &Broker{} }

// Publish sends e to every subscriber.
func (b *Broker) Publish(e client.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	b.f.publish(e)
}

// Subscribe returns a channel of events and a function that ends the subscription.
func (b *Broker) Subscribe() (<-chan client.Event, func()) { return b.f.subscribe() }
