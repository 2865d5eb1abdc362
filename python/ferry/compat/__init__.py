"""Drop-in replacements for other transfer engines' Python APIs."""
