//go:build unix

package providers

import (
	"net"
	"syscall"
)

// alive probes a connection nobody has used yet with a non-blocking read: nothing to read means it is
// open; end of file or an error means the server closed it.
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, err := syscall.Read(int(fd), b[:])
		open = n < 0 && (err == syscall.EAGAIN || err == syscall.EWOULDBLOCK)
		return true // never wait: this is a probe
	})
	return err == nil && open
}
