"""What tests share: builders, fakes (named so) and checks; no tests here."""
