"""The live ``hami scheduler`` process: extender, webhook, watches, leader election."""
