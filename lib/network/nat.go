package network

import "errors"

// AddNAT masquerades what the container with id and addr sends out of the host through
// any interface but its bridge.
func AddNAT(id, bridge, addr string) error { return errors.New("--nat is not implemented yet") }

// RemoveNAT removes the rules AddNAT made for id; none is fine.
func RemoveNAT(id string) error { return nil }

// NATRules lists the comments of LazyFork's NAT rules on this host.
func NATRules() ([]string, error) { return nil, nil }
