"""Runs programs: builds request trees and drives a backend (the lang issue builds it)."""
