"""medgpt-ray: Ray-native runner for the MedicalGPT pipeline."""
