package gvisor

// AlertsArmed is alertsArmed, for the package's external tests.
func (d *Driver) AlertsArmed(id string) bool { return d.alertsArmed(id) }

func (d *Driver) DetachedCallsOf(id string) []int { return d.detachedCallsOf(id) }
