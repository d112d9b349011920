"""The sampling role: questions, groups of answers, rewards, log-probs, delivery, eval."""
