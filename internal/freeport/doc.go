// Package freeport picks loopback ports for processes that bind them
// later: etcd members, serve replicas and the bench's serve, which are
// started on a port chosen beforehand and restarted on the same one.
//
// A port a listener on 127.0.0.1:0 was given is free only for a moment:
// once it is closed, the kernel may hand it out again as another
// listener's port or as an outgoing connection's source port, and the
// process started on it fails with "address already in use". The ports
// picked here lie below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), which the kernel never hands out on its
// own; only another process choosing ports itself can take one.
package freeport
