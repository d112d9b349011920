"""The training role: launch, receive and broadcast, experience, objective, update, publish."""
