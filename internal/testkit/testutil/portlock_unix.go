//go:build unix

package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lockPort takes port's lock file in dir without waiting; release unlocks
// it. The lock is the open file's: it ends with the file's close, or with
// the process.
func lockPort(dir string, port int) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errPortLocked
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}
