package pipeline

// Publisher is what the aggregators need from a producer.
//
// Contract: Publish must not block on the network (the aggregators call it
// from their flush goroutine, and Close flushes through it) and must be
// safe for concurrent use. It takes ownership of key and value. A nil
// error means the record will be delivered at least once; an error means
// it was dropped (the implementation counts it). *Producer implements it.
type Publisher interface {
	Publish(topic string, key, value []byte) error
}
