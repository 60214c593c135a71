from verifiers.base import VerifierResult

NAME, VERSION = "synthetic", "broken-1"
SELF_TEST = [("1", "1", True)]


def score(completion, reference):
    return VerifierResult(0.0, False, "always wrong")  # fails its own self-test
