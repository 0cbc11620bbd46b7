package kafka

// FailWrites makes Subscribers' writes to topic fail with err until called
// with nil.
func FailWrites(topic string, err error) { failWrites(topic, err) }
