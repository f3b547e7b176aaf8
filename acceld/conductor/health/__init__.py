"""Device health on the conductor's side: the purge of old device events. The quarantine
rules themselves are acceld.quarantine, below the API and the conductor."""
