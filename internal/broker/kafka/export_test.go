package kafka

// FailWrites makes Subscribers' writes to topic fail with err until called
// with nil.
func FailWrites(topic string, err error) { failWrites(topic, err) }

// HoldSplitTurn takes p's split writer as a concurrent call would, until
// release.
func HoldSplitTurn(p *Publisher) (release func()) {
	p.split.turn <- struct{}{}
	return func() { <-p.split.turn }
}
