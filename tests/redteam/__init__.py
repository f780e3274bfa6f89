"""The red team's tests (harnessrl/redteam.py): attacker agent programs against every suite family."""
