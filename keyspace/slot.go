package keyspace

import "strconv"

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot is the Redis Cluster hash slot of the keys whose hash tag is tag
// (the text between a key's first "{" and the next "}"): CRC-16/XMODEM of
// it, modulo Slots.
func Slot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % Slots
}

// InShare returns name, or name with a "-K" suffix (the least K ≥ 1 that
// does it), as a hash tag whose slot lies in share i of n equal shares of
// the slot space, [i·Slots/n, (i+1)·Slots/n): n names made so spread evenly
// over a Cluster whose masters hold equal runs of slots (what `redis-cli
// --cluster create` makes), instead of wherever CRC16 puts similar names.
// 0 ≤ i < n ≤ Slots.
func InShare(name string, i, n int) string {
	lo, hi := i*Slots/n, (i+1)*Slots/n
	q := name
	for k := 1; k < 1<<16; k++ {
		if s := Slot(q); s >= lo && s < hi {
			break
		}
		q = name + "-" + strconv.Itoa(k)
	}
	return q
}
