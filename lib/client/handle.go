package client

import (
	"context"
	"errors"
)

// Container is a handle on one container: a name, an id or a unique id prefix. Nothing
// is asked of the daemon until a method is called.
type Container struct {
	Client *Client
	Ref    string
}

// Container returns a handle on ref.
func (c *Client) Container(ref string) *Container { return &Container{Client: c, Ref: ref} }

// Forks are the handles a fork returned, by id.
type Forks []*Container

// Fork makes n running copies of the container.
func (h *Container) Fork(ctx context.Context, n int) (Forks, error) {
	return h.ForkWith(ctx, ForkRequest{N: n})
}

// ForkWith forks with every option of ForkRequest.
func (h *Container) ForkWith(ctx context.Context, req ForkRequest) (Forks, error) {
	res, err := h.Client.Fork(ctx, h.Ref, req, nil)
	if err != nil {
		return nil, err
	}
	out := make(Forks, len(res.Forks))
	for i, f := range res.Forks {
		out[i] = h.Client.Container(f.ID)
	}
	return out, nil
}

// Exec runs argv inside the container and returns its output and exit code.
func (h *Container) Exec(ctx context.Context, argv ...string) (*ExecResult, error) {
	return h.Client.Exec(ctx, h.Ref, ExecRequest{Argv: argv})
}

// Info returns the container's live view.
func (h *Container) Info(ctx context.Context) (*Info, error) { return h.Client.Get(ctx, h.Ref) }

// Stats returns its memory, snapshot and timing figures.
func (h *Container) Stats(ctx context.Context) (*Stats, error) { return h.Client.Stats(ctx, h.Ref) }

// Stop snapshots it and ends its processes.
func (h *Container) Stop(ctx context.Context) error {
	_, err := h.Client.Stop(ctx, h.Ref, StopRequest{})
	return err
}

// Start restarts it from its snapshot.
func (h *Container) Start(ctx context.Context) error {
	_, err := h.Client.Start(ctx, h.Ref)
	return err
}

// Freeze pauses it; Thaw resumes it.
func (h *Container) Freeze(ctx context.Context) error { return h.Client.Freeze(ctx, h.Ref) }
func (h *Container) Thaw(ctx context.Context) error   { return h.Client.Thaw(ctx, h.Ref) }

// Delete removes it; its forks keep running.
func (h *Container) Delete(ctx context.Context) error { return h.Client.Delete(ctx, h.Ref) }

// Delete removes every fork, ignoring ones already gone, and returns the other errors.
func (fs Forks) Delete(ctx context.Context) error {
	var errs []error
	for _, f := range fs {
		if err := f.Delete(ctx); err != nil && !IsCode(err, CodeNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
