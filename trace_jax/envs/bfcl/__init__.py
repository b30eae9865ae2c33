"""The BFCL v4 multi-turn family: function calling against bfcl-eval's simulated APIs (file system, trading, travel,
vehicle, messaging, posting, tickets, math), scored by bfcl-eval's own state and response checks."""
