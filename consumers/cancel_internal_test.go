package consumers

import (
	"testing"
	"time"
)

// Every delivery of a job sleeping on its slot in this process is woken by its cancel, one that goes to
// sleep after the cancel was told at once, and another job's sleep not at all.
func TestCancelNotesWakeEverySleeper(t *testing.T) {
	var c cancelNotes
	first, leave1 := c.sleep("acme", "pay-1")
	second, leave2 := c.sleep("acme", "pay-1")
	other, leave3 := c.sleep("acme", "pay-2")
	defer leave1()
	defer leave2()
	defer leave3()
	c.note("acme", "pay-1", time.Now())
	for i, ch := range []<-chan struct{}{first, second} {
		select {
		case <-ch:
		default:
			t.Errorf("sleeper %d of pay-1 not woken", i+1)
		}
	}
	select {
	case <-other:
		t.Error("pay-2's sleeper woken by pay-1's cancel")
	default:
	}
	late, leave4 := c.sleep("acme", "pay-1")
	defer leave4()
	select {
	case <-late:
	default:
		t.Error("a sleep begun after the cancel was told is not woken at once")
	}
}
