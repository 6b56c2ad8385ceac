"""Test rigs of the ebs WAL (the crash-loop writer). Runtime modules never import them."""
