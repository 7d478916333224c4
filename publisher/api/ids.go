package api

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"time"
)

// timeIDHex is the hex digits of a timeID: 48 bits of the Unix time in
// milliseconds, then 80 random bits (a file id's last one its purpose).
const timeIDHex = 32

// NewTimeID is prefix and the hex of 48 bits of now in Unix milliseconds
// and 80 random bits: the ids of files and batches.
func NewTimeID(prefix string, now time.Time) string {
	var b [timeIDHex / 2]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	_, _ = rand.Read(b[6:]) // never fails (crypto/rand documents it)
	return prefix + hex.EncodeToString(b[:])
}

// ValidTimeID reports whether id is prefix and timeIDHex lower-case hex
// digits, as NewTimeID makes them.
func ValidTimeID(prefix, id string) bool {
	if len(id) != len(prefix)+timeIDHex || !strings.HasPrefix(id, prefix) {
		return false
	}
	for i := len(prefix); i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
