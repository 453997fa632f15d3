import platform
import sys

print(f"hello from Python {platform.python_version()} inside codebox")
print("arguments:", sys.argv[1:])
