package queuetest

import (
	"testing"
	"testing/synctest"
)

func TestMemConformance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		RunConformance(t, func(*testing.T) QueueSender { return NewMem() })
	})
}
