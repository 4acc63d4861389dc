package tasks

// KeySlot is the Redis Cluster hash slot of a queue name (its hash tag).
func KeySlot(queue string) uint16 { return crc16(queue) % slots }
