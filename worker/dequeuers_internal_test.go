package worker

import (
	"slices"
	"testing"
)

// shareSlots gives every dequeuer at least one slot, no more dequeuers than
// slots, and slots that add up to the total, within one of each other.
func TestShareSlots(t *testing.T) {
	for _, c := range []struct {
		total, k int
		want     []int
	}{
		{266, 2, []int{133, 133}},
		{12, 3, []int{4, 4, 4}},
		{11, 3, []int{4, 4, 3}},
		{1, 2, []int{1}},
		{5, 0, []int{5}},
	} {
		if got := shareSlots(c.total, c.k); !slices.Equal(got, c.want) {
			t.Errorf("shareSlots(%d, %d) = %v, want %v", c.total, c.k, got, c.want)
		}
	}
}
