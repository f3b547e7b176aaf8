"""Console scripts other than ``acceld`` itself."""
