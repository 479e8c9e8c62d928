package kafka

// Abandon makes the member leave as a crashed process would: in-flight records are not waited for, and
// stay uncommitted. A test hook, not part of the adapter's API.
func (b *Broker) Abandon() { b.abandonOnce.Do(func() { close(b.abandon) }) }
