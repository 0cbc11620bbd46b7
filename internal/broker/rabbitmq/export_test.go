package rabbitmq

// TierName spells a tier as the driver names its delay queue.
var TierName = tierName
